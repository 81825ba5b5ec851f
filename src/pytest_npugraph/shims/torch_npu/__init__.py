"""Emulated ``torch_npu`` (pytest-npugraph): the real package's Python surface over an emulated
Ascend device that computes on the CPU and records every task for the plugin's checks.

Importing it patches torch as the real one does: ``torch.npu``, ``torch.device("npu")``,
``Tensor.npu()``/``is_npu``, ``Module.npu()``, ``device="npu"`` in factories, and the custom ops
as ``torch.ops.npu.*`` / ``torch_npu.npu_*``.
"""
import torch

from . import _C
from . import npu
from pytest_npugraph.runtime import backend as _backend

_backend.install(npu)

from .npu.utils import _erase_stream as erase_stream  # noqa: E402

__version__ = "2.14.0"
version = __version__
_EMULATED = True   # lets a suite tell the emulation from the real package


class _MissingOpError(AttributeError):
    """An op the emulator lacks: say which, and how to supply it."""


def __getattr__(name):
    if name.startswith("npu_") or name.startswith("_npu_"):
        packet = getattr(torch.ops.npu, name, None) if hasattr(torch.ops, "npu") else None
        if packet is not None:
            return packet
        raise _MissingOpError(
            f"torch_npu.{name} is not emulated by pytest-npugraph. Supply a CPU implementation with the "
            f"pytest_npugraph_register_ops hook in your conftest.py:\n"
            f"    def pytest_npugraph_register_ops(registry):\n"
            f"        registry.register('{name}', '{name}(Tensor self) -> Tensor', my_cpu_impl, "
            f"cores={{'kind': 'AIV'}})")
    raise AttributeError(f"module 'torch_npu' has no attribute '{name}'")
