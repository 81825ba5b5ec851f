"""AOTAutograd's stream pass asks the device's memory bandwidth; the emulated NPU answers it.

Why: a ``torch.npu.stream(s)`` (or ``torchair.scope.npu_stream_switch``) scope inside a compiled
function that is trained through makes torch 2.13's AOTAutograd place the frees of tensors last used
on another stream (``_aot_autograd/streams.py``, ``sync_deallocations``) by a roofline estimate of
each backward op.  The estimate's memory side divides the bytes an op moves by
``torch._inductor.utils.get_gpu_dram_gbps()``, which asks triton (``triton.testing.get_dram_gbps``):
on a machine without triton the compile failed with ``ModuleNotFoundError: No module named
'triton'``.  Its compute side already answers 0 for a device that is not CUDA ("roofline estimates
will use memory bandwidth only").

What this does: ``torch.utils._runtime_estimation.get_gpu_dram_gbps`` answers a bandwidth when no
CUDA device is present, as torch's compute side does, instead of asking triton.  The estimate only
places a ``sync_dealloc`` at or after the event the side stream records after its last use, never
before it, so no bandwidth can make the graph unsafe; and one bandwidth for every op of an emulated
device that has no clock leaves the placement to the bytes each op moves, as torch's formula has it.
(The pass reads tensors from a node meta key the joint graph does not carry, so today every op's
estimate is 0 bytes whatever the bandwidth.)  With CUDA present, torch's own function runs.
"""
from __future__ import annotations

import sys

EMULATED_GBPS = 1600     # GB/s, one figure for every emulated chip (no datasheet's): only ratios between ops matter

_original = None


def _get_gpu_dram_gbps():
    import torch

    if torch.cuda.is_available():
        return _original()
    return EMULATED_GBPS


def install() -> bool:
    """Answer the bandwidth question (idempotent).  Imports nothing, as ``compiled_backward.install``:
    False while ``torch.utils._runtime_estimation`` is not loaded (AOTAutograd's stream module loads
    it), and the next call does it."""
    global _original
    if _original is not None:
        return True
    module = sys.modules.get("torch.utils._runtime_estimation")
    if module is None or not hasattr(module, "get_gpu_dram_gbps"):
        return False
    _original = module.get_gpu_dram_gbps
    module.get_gpu_dram_gbps = _get_gpu_dram_gbps
    return True
