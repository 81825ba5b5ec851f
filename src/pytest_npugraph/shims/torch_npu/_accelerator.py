"""What torch asks of an accelerator backend that a Python backend cannot register through
PrivateUse1 hooks: NPU generators and pinned host memory; and inductor's device entry.

torch_npu provides these in C++ (``getNewGenerator``, ``getPinnedMemoryAllocator``, its inductor
backend).  Without them ``torch.Generator(device="npu")``, ``Tensor.pin_memory()`` and
``DataLoader(pin_memory=True)`` fail inside torch, and ``torch.compile`` with inductor fails with
``KeyError: 'npu'``.  NPU ops run on the CPU here, so an NPU generator is a CPU generator that
reports ``device='npu:N'``, and pinned memory is a host copy marked as pinned.
"""
from __future__ import annotations

import torch

from pytest_npugraph.runtime.generators import NpuGenerator
from pytest_npugraph.runtime.outside_dynamo import outside_dynamo

_installed = False


# ------------------------------------------------------------------ generators
class _GeneratorType(type(torch._C.Generator)):
    def __instancecheck__(cls, obj) -> bool:      # CPU generators made by torch are still torch.Generators
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, torch._C.Generator)


class Generator(NpuGenerator, metaclass=_GeneratorType):
    """``torch.Generator``; for ``device="npu[:N]"`` a generator of the emulated NPU (CPU kernels draw
    from it, since NPU ops compute on the CPU: ``runtime.generators.NpuGenerator``)."""

    def __new__(cls, device="cpu"):
        d = torch.device(device)
        if d.type != "npu":
            return torch._C.Generator(d)
        return super().__new__(cls, torch.npu.current_device() if d.index is None else d.index)

    def __reduce__(self):
        return Generator, (self.device,), self.get_state()


Generator.__module__ = "torch"
Generator.__qualname__ = Generator.__name__ = "Generator"


# ---------------------------------------------------------------- pinned memory
# (runtime/pinned.py, installed by backend.install: pin_memory=True factories, Tensor.pin_memory/is_pinned)
from pytest_npugraph.runtime.pinned import is_pinned, pin_memory  # noqa: E402,F401


# ------------------------------------------------------------------- accelerator
_accelerator_current_stream = torch.accelerator.current_stream
_accelerator_set_stream = torch.accelerator.set_stream
_accelerator_synchronize = torch.accelerator.synchronize


def _npu_index(device):
    """The npu device index ``device`` names (None: the current one), or False for another device type."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.type == "npu" else False


@outside_dynamo
def current_stream(device=None, /):
    """``torch.accelerator.current_stream``: a ``torch.Stream`` naming the emulated stream current on the
    npu device, as torch's is (torch's own asks a C++ device guard that a Python backend cannot
    provide, and always answers stream 0)."""
    index = _npu_index(device)
    if index is False:
        return _accelerator_current_stream(device)
    import torch_npu

    s = torch_npu.npu.current_stream(index)
    return torch.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


@outside_dynamo
def set_stream(stream, /) -> None:
    """``torch.accelerator.set_stream``: an npu stream becomes the emulated current stream."""
    if getattr(stream, "device_type", None) == torch._C._autograd.DeviceType.PrivateUse1.value:
        import torch_npu
        from torch_npu.npu.streams import as_npu_stream

        return torch_npu.npu.set_stream(as_npu_stream(stream))
    return _accelerator_set_stream(stream)


@outside_dynamo
def synchronize(device=None, /) -> None:
    """``torch.accelerator.synchronize``: a host sync with the emulated npu device."""
    index = _npu_index(device)
    if index is False:
        return _accelerator_synchronize(device)
    import torch_npu

    return torch_npu.npu.synchronize(index)


for _mine, _torchs in ((current_stream, _accelerator_current_stream), (set_stream, _accelerator_set_stream),
                       (synchronize, _accelerator_synchronize)):
    _mine.__doc__, _mine.__module__ = _torchs.__doc__, _torchs.__module__


# --------------------------------------------------------------------- inductor
INDUCTOR_MESSAGE = (
    "torch.compile's default backend 'inductor' cannot compile for the emulated NPU: pytest-npugraph computes "
    "NPU ops on the CPU and has no inductor code generator for 'npu' (on hardware torch_npu's own inductor "
    "backend does this). Backends that work here: backend=torchair.get_npu_backend(compiler_config=...) (GE "
    "'max-autotune' or 'reduce-overhead' mode), backend='npugraph_ex', backend='aot_eager' or backend='eager'.")


class _Refuses(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(INDUCTOR_MESSAGE)


class _NoInductorForNpu(metaclass=_Refuses):
    """What inductor finds as the npu device's scheduling and wrapper code generators (through
    ``torch.npu.Scheduling`` & co, inductor's PrivateUse1 registration): using one raises."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(INDUCTOR_MESSAGE)


def inductor_entry(name: str):
    """``torch.npu.<name>`` for inductor's ``init_backend_registration`` (None for other names)."""
    if name not in ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"):
        return None
    from torch._inductor.codegen import common
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides

    if "npu" not in common.device_op_overrides_dict:
        common.register_device_op_overrides("npu", CpuDeviceOpOverrides())
    return _NoInductorForNpu


def _refuse_inductor_on_npu() -> None:
    """``torch.compile``'s inductor entry (``torch._TorchCompileInductorWrapper``): NPU example inputs
    fail at once with ``INDUCTOR_MESSAGE``, before inductor lowers anything (CPU graphs compile as usual)."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_npugraph", False):
        return
    original = wrapper.__call__

    def __call__(self, model_, inputs_):
        if any(isinstance(x, torch.Tensor) and x.device.type == "npu" for x in inputs_):
            raise RuntimeError(INDUCTOR_MESSAGE)
        return original(self, model_, inputs_)

    __call__._npugraph = True
    wrapper.__call__ = __call__


def install() -> None:
    global _installed
    if _installed:
        return
    _refuse_inductor_on_npu()
    torch.Generator = Generator
    torch.accelerator.current_stream = current_stream
    torch.accelerator.set_stream = set_stream
    torch.accelerator.synchronize = synchronize
    _installed = True
