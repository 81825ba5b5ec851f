"""The backward of a compiled region takes NPU tensors as the plain tensors they are on hardware.

Why: ``torch.compile`` traces an NPU tensor as a plain FakeTensor on ``npu`` (``NpuTensor.
__tensor_unflatten__``), as Dynamo sees a real torch_npu tensor, so AOTAutograd records every
forward output, and so every tangent, as a plain tensor.  At run time the gradient reaching the
compiled backward is an ``NpuTensor``, a traceable wrapper subclass to AOTAutograd's runtime
check (``AOTDispatchAutograd.process_runtime_tangent``), which then refuses it ("we encountered a
tensor subclass where we guessed its metadata incorrectly"): ``loss.backward()`` after a compiled
forward failed in every backend (GE, reduce-overhead, npugraph_ex, aot_eager).  On hardware the
same gradient is a plain ``torch.Tensor`` and passes.

What this does: before AOTAutograd's check, a tangent that is an NPU tensor and was traced as a
plain tensor is brought to the traced memory format (what the check does for a plain tensor) and
passed on as it is; everything else goes to torch's check unchanged.  The compiled backward then
runs as one autograd node, on its forward's stream with the engine's syncs (``autograd_streams``).

Installed when ``torch._dynamo`` is first imported (the shims' Dynamo setup), or at the latest when
Dynamo first traces an NPU tensor, before AOTAutograd compiles the graph: it binds the check into
each compiled backward's prologue when it compiles it.
"""
from __future__ import annotations

import sys

_original = None


def _process_runtime_tangent(x, meta, *args, **kwargs):
    """``AOTDispatchAutograd.process_runtime_tangent`` with NPU tensors taken as plain tensors."""
    from torch._functorch._aot_autograd.runtime_wrappers import coerce_to_expected_memory_format
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta

    from .tensor import NpuTensor

    if type(x) is NpuTensor and not isinstance(meta, SubclassCreationMeta):
        if not meta.memory_format:
            raise AssertionError("meta.memory_format must not be None")
        x = coerce_to_expected_memory_format(x, meta.memory_format)
        return x, [x]
    return _original(x, meta, *args, **kwargs)


def install() -> bool:
    """Route AOTAutograd's tangent check through ``_process_runtime_tangent`` (idempotent).  Imports
    nothing: when AOTAutograd's runtime module is not loaded yet, or is still loading (it imports
    ``torch._dynamo`` at its top, whose import runs this), it returns False and the next call
    (tracing an NPU tensor, ``tensor._fake_on_npu``) does it; importing it here from inside that
    import chain was a circular import."""
    global _original
    if _original is not None:
        return True
    wrappers = sys.modules.get("torch._functorch._aot_autograd.runtime_wrappers")
    cls = getattr(wrappers, "AOTDispatchAutograd", None)
    if cls is None or not hasattr(wrappers, "coerce_to_expected_memory_format"):
        return False
    _original = cls.process_runtime_tangent
    cls.process_runtime_tangent = staticmethod(_process_runtime_tangent)
    return True
