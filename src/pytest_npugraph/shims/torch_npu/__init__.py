"""Emulated ``torch_npu`` (pytest-npugraph): the real package's Python surface over an emulated
Ascend device that computes on the CPU and records every task for the plugin's checks.

Importing it patches torch as the real one does: ``torch.npu``, ``torch.device("npu")``,
``Tensor.npu()``/``is_npu``, ``Module.npu()``, ``device="npu"`` in factories, and the custom ops
as ``torch.ops.npu.*`` / ``torch_npu.npu_*``.
"""
import torch

from . import _C
from . import npu
from pytest_npugraph import _context
from pytest_npugraph.runtime import backend as _backend

_backend.install(npu)    # the npu key's kernels, device guard and bare-device resolution

from . import _accelerator, _parallel_comm  # noqa: E402
from .npu._format import Format, get_npu_format  # noqa: E402,F401

_accelerator.install()
_parallel_comm.install()     # torch._C._scatter/_gather/_broadcast(_coalesced) for npu tensors (DataParallel)

from .npu.utils import _erase_stream as erase_stream  # noqa: E402
from . import atb  # noqa: E402,F401  (torch_npu.atb: the ATB ops of _atb_ops.ATB_API_LIST)
from . import distributed  # noqa: E402,F401  (registers the hccl backend)
from .utils import _dynamo as _dynamo_patch  # noqa: E402

_dynamo_patch.install()     # streams/events in compiled regions, the "npu" and "npugraph_ex" backends
_context.set_torch_version_cann(_context.CONTEXT.config.cann)   # as torch_npu's collect_env does



class _NpuDType(int):
    """A torch_npu-only dtype constant (``torch_npu.hifloat8`` ...): the ScalarType number torch_npu ops take in
    their ``int?`` dtype arguments (these dtypes have no torch.dtype; their tensors are uint8 in torch)."""

    def __new__(cls, value: int, name: str):
        self = super().__new__(cls, value)
        self._name = name
        return self

    def __repr__(self):
        return f"torch_npu.{self._name}"

    __str__ = __repr__

    def __reduce__(self):
        return (_NpuDType, (int(self), self._name))


int4 = _NpuDType(285, "int4")
hifloat8 = _NpuDType(290, "hifloat8")
float8_e8m0fnu = _NpuDType(293, "float8_e8m0fnu")
float4_e2m1fn_x2 = _NpuDType(296, "float4_e2m1fn_x2")
float4_e1m2fn_x2 = _NpuDType(297, "float4_e1m2fn_x2")

__version__ = "2.14.0"
version = __version__
_EMULATED = True   # lets a suite tell the emulation from the real package


class _MissingOpError(AttributeError):
    """An op the emulator lacks: say which, and how to supply it."""


def _deprecated_torch_op(name: str):
    def op(*args, **kwargs):
        from pytest_npugraph.runtime.errors import ErrCode, pta_error

        raise RuntimeError(f"torch.{name} is deprecated and will be removed in future version. "
                           f"Use torch_npu.{name} instead." + pta_error(ErrCode.NOT_SUPPORT))
    op.__name__ = op.__qualname__ = name
    return op


def _export_torch_ops() -> None:
    """As torch_npu does: ``torch.<op>`` for every npu op name, a wrapper raising "deprecated"."""
    from pytest_npugraph.runtime.ops import library as _ops

    for name in _ops.op_names():
        if not hasattr(torch, name):
            setattr(torch, name, _deprecated_torch_op(name))


from .npu import _save_tensor  # noqa: E402,F401  (npu::save_npugraph_tensor, torch_npu.save_npugraph_tensor)

_export_torch_ops()


_SUBMODULES = ("profiler", "op_plugin", "multiprocessing")


def __getattr__(name):
    """Every op of torch_npu's ``npu`` namespace is ``torch_npu.<name>`` (torch_npu exports each name
    of ``torch.ops.npu``), and so are the ATB ops of ``_atb_ops.API_LIST`` (``torch_npu._npu_paged_attention``
    is ``torch.ops.atb._npu_paged_attention``; the others are ``torch_npu.atb.<name>``); ops the emulator
    has no math for raise ``NotImplementedError`` when called."""
    if name in _SUBMODULES:             # imported by torch_npu's __init__; here on first use
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    from pytest_npugraph.runtime.ops import library as _ops, registry as _registry

    top_level = not name.startswith("__") and _registry.atb_exports().get(name, "torch_npu") == "torch_npu"
    packet = _ops.packet(name) if top_level else None
    if packet is not None:
        return packet
    if name.startswith("npu_") or name.startswith("_npu_"):
        raise _MissingOpError(
            f"torch_npu.{name} is not an op of torch_npu 2.14.0 nor one registered with pytest-npugraph. "
            f"Supply a CPU implementation with the pytest_npugraph_register_ops hook in your conftest.py:\n"
            f"    def pytest_npugraph_register_ops(registry):\n"
            f"        registry.register('{name}', '{name}(Tensor self) -> Tensor', my_cpu_impl, "
            f"cores={{'kind': 'AIV'}})")
    raise AttributeError(f"module 'torch_npu' has no attribute '{name}'")


def __dir__():
    from pytest_npugraph.runtime.ops import library as _ops, registry as _registry

    atb = {name for name, where in _registry.atb_exports().items() if where == "torch_npu"}
    return sorted(set(globals()) | set(_ops.op_names()) | atb)
