"""The one device resolver: a device argument -> the npu index it names (``backend.device_index``).

A bare ``"npu"`` means the calling thread's current device (``torch.npu.set_device``; rank r's
thread in ``npugraph.run_ranks``), as torch_npu's C++ device guard answers it.  Every device-index
decision of the emulator goes through ``device_index``; ``with_index`` makes a bare npu explicit
for arguments handed on to torch, whose C++ would otherwise resolve it to 0 (see
``backend.NpuDeviceGuard``).
"""
from __future__ import annotations

import torch

from .runtime import current

NPU = "npu"
_Device = torch.device


def device_index(device=None) -> int:
    """None / ``"npu"`` / ``torch.device("npu")`` -> the calling thread's current device; an int,
    ``"npu:N"`` or ``torch.device("npu", N)`` -> N.  Another device type is a ``ValueError`` (the
    message of torch_npu's ``_get_device_index``)."""
    if device is None:
        return current().current_device()
    kind = type(device)
    if kind is int:
        return device
    if kind is str:
        device = _Device(device)
    elif not isinstance(device, _Device):
        raise TypeError(f"Expected a npu device (str, int or torch.device), but got: {type(device).__name__}")
    if device.type != NPU:
        raise ValueError(f"Expected a npu device, but got: {device}")
    index = device.index
    return current().current_device() if index is None else index


def with_index(device):
    """``device`` with a bare npu made ``npu:<current>``; any other value (indexed devices, other
    types, dtypes, tensors...) as is."""
    kind = type(device)
    if (kind is str and device == NPU) or (kind is _Device and device.type == NPU and device.index is None):
        return _Device(NPU, current().current_device())
    return device
