"""Devices and the current stream (mirrors ``torch_npu/npu/utils.py``)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch._utils import _get_device_index as _torch_get_device_index

import torch_npu
from torch_npu import _C
from pytest_npugraph.runtime.errors import ErrCode, pta_error


def synchronize(device=None) -> None:
    """Wait for all work on every stream of the device (the current one by default)."""
    torch_npu.npu._lazy_init()
    with torch_npu.npu.device(device):
        return _C._npu_synchronize()


def set_device(device) -> None:
    index = _get_device_index(device, optional=True)
    if index >= 0:
        _C._npu_setDevice(index)


def current_device() -> int:
    torch_npu.npu._lazy_init()
    return _C._npu_getDevice()


class device:
    """Context manager selecting a device; a negative index or None is a no-op."""

    def __init__(self, device):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx < 0:
            return
        self.prev_idx = _C._npu_getDeviceWithoutSet()
        if self.prev_idx != self.idx:
            _C._npu_setDevice(self.idx)
        torch_npu.npu._lazy_init()

    def __exit__(self, *args):
        if self.idx < 0:
            self.idx = -1
            return False
        if self.prev_idx == -1:
            self.prev_idx = 0
        self.idx = _C._npu_maybeExchangeDevice(self.prev_idx)
        return False


def _get_device_index(device: Any, optional: bool = False, allow_cpu: bool = False) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if allow_cpu:
            if device.type not in ("npu", "cpu"):
                raise ValueError(f"Expected a npu or cpu device, but got: {device}" + pta_error(ErrCode.VALUE))
        elif device.type != "npu":
            raise ValueError(f"Expected a npu device, but got: {device}" + pta_error(ErrCode.VALUE))
    if isinstance(device, torch_npu.npu.device):
        return device.idx
    if optional and (device is None or (isinstance(device, torch.device) and device.index is None)):
        return current_device()
    return _torch_get_device_index(device, optional, allow_cpu)


def _attribute(obj, name: str):
    """``obj.<name>`` where torch_npu's Python reads it unchecked: the same AttributeError, raised here."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{name}'") from None


class device_of(device):
    """Context manager selecting the device of a tensor (no-op for CPU tensors)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if _attribute(obj, "is_npu") else -1)


class StreamContext:
    """Context manager selecting a stream (and its device) for the enclosed work."""

    cur_stream: Optional["torch_npu.npu.Stream"]

    def __init__(self, stream_ctx):
        self.stream = stream_ctx
        self.idx = _get_device_index(None, True)
        self.src_prev_stream = None
        self.dst_prev_stream = None

    def __enter__(self):
        cur_stream = self.stream
        if cur_stream is None or self.idx == -1:
            return
        self.src_prev_stream = torch.npu.current_stream()
        if self.src_prev_stream.device != _attribute(cur_stream, "device"):
            with device(cur_stream.device):
                self.dst_prev_stream = torch.npu.current_stream(cur_stream.device)
        torch.npu.set_stream(cur_stream)

    def __exit__(self, exc_type, exc_value, traceback):
        cur_stream = self.stream
        if cur_stream is None or self.idx == -1:
            return
        if self.src_prev_stream.device != cur_stream.device:
            torch.npu.set_stream(self.dst_prev_stream)
        torch.npu.set_stream(self.src_prev_stream)


def stream(stream) -> StreamContext:
    return StreamContext(stream)


def set_stream(stream) -> None:
    if stream is None:
        return
    _C._npu_setStream(stream_id=_attribute(stream, "stream_id"), device_index=_attribute(stream, "device_index"),
                      device_type=_attribute(stream, "device_type"))


def current_stream(device=None):
    torch_npu.npu._lazy_init()
    sid, index, dtype = _C._npu_getCurrentStream(_get_device_index(device, optional=True))
    return torch_npu.npu.Stream(stream_id=sid, device_index=index, device_type=dtype)


def default_stream(device=None):
    torch_npu.npu._lazy_init()
    sid, index, dtype = _C._npu_getDefaultStream(_get_device_index(device, optional=True))
    return torch_npu.npu.Stream(stream_id=sid, device_index=index, device_type=dtype)


def _erase_stream(tensor, stream) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor should be torch.Tensor, could not be {type(tensor)}" + pta_error(ErrCode.TYPE))
    if not isinstance(stream, torch_npu.npu.Stream):
        raise TypeError(f"stream should be torch_npu.npu.Stream, could not be {type(stream)}"
                        + pta_error(ErrCode.TYPE))
    block = getattr(tensor, "_block", None)
    if block is not None:
        block.stream_uses.discard(stream._state.sid)


def get_cann_version(module="CANN") -> str:
    """The running test's CANN release (``--npu-cann`` / ``npu_cann`` marker; cann.py)."""
    from pytest_npugraph import cann

    return cann.current().version


def _is_gte_cann_version(version, module="CANN") -> bool:
    def parts(v):
        return tuple(int(p) for p in str(v).split(".")[:3] if p.isdigit())
    return parts(get_cann_version(module)) >= parts(version)
