"""Make torch know the ``npu`` device: once per process, when the emulated torch_npu is imported.

This is what ``import torch_npu`` does to torch (rename PrivateUse1 to ``npu``, register
``torch.npu``, add ``Tensor.npu``/``is_npu``/``Module.npu``), done through PyTorch's Python
backend hooks, plus a PrivateUse1 fallback that creates NPU tensors for factory functions.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from .outside_dynamo import outside_dynamo
from .tensor import NPU, NpuTensor, _launch, _unwrap, wrap
from .runtime import current

_installed = False
_library = None


def _target_device(args, kwargs):
    for value in list(kwargs.values()) + list(args):
        if isinstance(value, torch.device) and value.type == NPU:
            return current().current_device() if value.index is None else value.index
    return current().current_device()


@outside_dynamo
def _privateuse1_fallback(keyset, op, *args, **kwargs):
    """Ops that reach the npu backend with no NPU tensor argument: factories (``empty``...)."""
    index = _target_device(args, kwargs)
    current().check_device(index)
    out = op(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    created = []

    def wrap_one(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, NpuTensor):
            t = wrap(x, index)
            created.append(t)
            return t
        return x

    result = tree_map(wrap_one, out)
    name = op._schema.name
    if not name.startswith("aten::empty") and created:
        _launch(name, index, [], created)
    return result


def _tensor_npu(self, device=None, non_blocking=False, **kwargs):
    """``Tensor.npu``: copy to an NPU (the current one by default)."""
    if device is None:
        index = current().current_device()
    elif isinstance(device, int):
        index = device
    else:
        try:
            d = torch.device(device)
        except (RuntimeError, TypeError):
            raise RuntimeError("Invalid device, must be npu device") from None
        if d.type != NPU:
            raise RuntimeError("Invalid device, must be npu device")
        index = current().current_device() if d.index is None else d.index
    return self.to(torch.device(NPU, index), non_blocking=non_blocking, **kwargs)


def _module_npu(self, device=None):
    return self._apply(lambda t: _tensor_npu(t, device))


def _trace_without_device_init() -> None:
    """Tracing never computes on the emulated device, as torch traces for a device it must not
    initialise (``FakeTensorMode.avoid_device_init``): ``torch.tensor(data, device="npu")`` lifts
    the data on the host and copies it with the Python key on, and FakeTensorMode does not
    constant-propagate host-to-npu copies.  A compiled region's graph then holds a host constant and
    an H2D copy, never a real NpuTensor made while tracing (no stray task in the trace, and no
    constant FakeTensor standing for an NPU tensor, which Dynamo cannot fake)."""
    torch._C._set_only_lift_cpu_tensors(True)     # this thread; FakeTensorMode sets it for others
    from torch._subclasses.fake_tensor import FakeTensorMode

    declared = FakeTensorMode.__dict__["avoid_device_init"]

    def avoid_device_init(self) -> bool:
        if declared.fget(self):
            return True
        other = torch.cuda.is_available() or (hasattr(torch, "hpu") and torch.hpu.is_available())
        if torch.xpu._is_compiled():
            other = other or torch.xpu.is_available()
        return not other       # only the emulated npu made the device available

    FakeTensorMode.avoid_device_init = property(avoid_device_init, doc=declared.__doc__)


def _refuse_npu_storages() -> None:
    """``torch.UntypedStorage(n, device="npu")`` (and ``TypedStorage``, which makes one) asks the
    C++ allocator of PrivateUse1, which a Python backend cannot register: torch dereferences a null
    allocator and the whole pytest process dies with a segmentation fault.  Refuse it with an error
    instead; NPU memory here belongs to NPU tensors."""
    storage_new = torch.UntypedStorage.__new__

    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        if isinstance(device, (str, torch.device)) and torch.device(device).type == NPU:
            raise RuntimeError(
                f"pytest-npugraph: torch.UntypedStorage(..., device={str(device)!r}) is not emulated: NPU memory "
                f"belongs to NPU tensors here. Allocate a tensor instead (torch.empty(nbytes, dtype=torch.uint8, "
                f"device='npu')) and use it, or its untyped_storage(), where the storage was to be used.")
        return storage_new(cls, *args, **kwargs)

    torch.UntypedStorage.__new__ = __new__


def install(npu_module) -> None:
    """Register the npu device with torch (idempotent; cannot be undone within a process)."""
    global _installed, _library
    if _installed:
        return
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", NPU):
        raise RuntimeError(f"PrivateUse1 is already renamed to {name!r}; cannot emulate npu in this process")
    from torch.utils import backend_registration as br

    if name != NPU:
        br._setup_privateuseone_for_python_backend(rename=NPU, backend_module=npu_module)
    _library = torch.library.Library("_", "IMPL")
    _library.fallback(_privateuse1_fallback, dispatch_key="PrivateUse1", with_keyset=True)
    _trace_without_device_init()
    _refuse_npu_storages()
    torch.Tensor.npu = _tensor_npu
    torch.nn.Module.npu = _module_npu
    from . import autocast, pinned, serialization
    from .ops import library

    library.install()
    serialization.install()
    autocast.install()
    pinned.install()
    _installed = True
