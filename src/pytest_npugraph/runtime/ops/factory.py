"""torch_npu's factory ops with no tensor argument (``empty_with_format`` and its family).

The dispatcher picks a kernel from the tensor arguments; a factory op has none, so torch_npu
registers it for ``BackendSelect``, which reads the ``device`` argument.  Here the BackendSelect
kernel makes the result on the emulated NPU the ``device`` names (through the device's caching
allocator, so an oversized request is the NPU's out-of-memory), computing it with the op's CPU
kernel; without an npu ``device`` the op fails as torch_npu's does, having no CPU kernel.
"""
from __future__ import annotations

from typing import Optional

import torch

from .layout import formatted_empty, storage_nbytes
from .spec import OpSpec

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _dtype(dtype) -> torch.dtype:
    return torch.get_default_dtype() if dtype is None else dtype


def empty_with_format(size, *, dtype=None, layout=None, device=None, pin_memory=None, acl_format: int = 2,
                      base_addr_aligned_kb: Optional[int] = None) -> torch.Tensor:
    """Uninitialised memory whose storage is sized for ``acl_format`` (FRACTAL_NZ pads to 16 x C0 blocks)."""
    return formatted_empty(size, _dtype(dtype), acl_format)


def unsafe_empty_with_format(size, *, dtype=None, layout=None, device=None, pin_memory=None, acl_format: int = 2,
                             keep_format: bool = False) -> torch.Tensor:
    return formatted_empty(size, _dtype(dtype), acl_format)


def empty_with_swapped_memory(size, *, dtype=None, device=None) -> torch.Tensor:
    """Device-addressable host (swapped) memory: on the emulated device an ordinary ND tensor."""
    return formatted_empty(size, _dtype(dtype), 2)


SPECS = [
    OpSpec("empty_with_format(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
           "bool? pin_memory=None, int acl_format=2, int? base_addr_aligned_kb=None) -> Tensor", empty_with_format),
    OpSpec("unsafe_empty_with_format(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
           "bool? pin_memory=None, int acl_format=2, bool keep_format=False) -> Tensor", unsafe_empty_with_format),
    OpSpec("empty_with_swapped_memory(int[] size, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
           empty_with_swapped_memory),
]


def is_factory(schema) -> bool:
    """No tensor argument and a ``device`` one: the dispatcher needs a BackendSelect kernel."""
    return not any("Tensor" in str(a.type) for a in schema.arguments) and \
        any(a.name == "device" for a in schema.arguments)


def backend_select_kernel(op_name: str):
    """The BackendSelect kernel of factory op ``op_name`` (``"npu::empty_with_format"``)."""
    def kernel(*args, **kwargs):
        from ..runtime import current
        from ..tensor import wrap

        device = kwargs.get("device")
        if device is None or torch.device(device).type != "npu":
            where = "CPU" if device is None else torch.device(device).type.upper()
            raise NotImplementedError(f"Could not run '{op_name}' with arguments from the '{where}' backend. "
                                      f"'{op_name}' is only available for these backends: [PrivateUse1, Meta].")
        from ..backend import device_index

        rt = current()
        index = device_index(device)
        rt.check_device(index)
        rt.devices[index].initialized = True
        size = args[0] if args else kwargs["size"]
        nbytes = storage_nbytes(size, _dtype(kwargs.get("dtype")), kwargs.get("acl_format", 2))
        rt.check_allocation(index, nbytes)          # the NPU's OutOfMemoryError before the payload is made
        payload = kernel.overload.redispatch(_CPU, *args, **dict(kwargs, device=torch.device("cpu")))
        return wrap(payload, index)
    kernel.overload = None
    return kernel
