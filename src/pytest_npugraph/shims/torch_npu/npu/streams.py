"""Streams and events (mirrors ``torch_npu/npu/streams.py``)."""
from __future__ import annotations

import ctypes

import torch

import torch_npu
from torch_npu import _C
from pytest_npugraph.runtime import callsite
from pytest_npugraph.runtime.errors import ErrCode, pta_error
from pytest_npugraph.runtime.runtime import current


class Stream(_C._NPUStreamBase):
    """An NPU stream: an in-order queue of device work."""

    def __new__(cls, device=None, priority=0, **kwargs):
        with torch_npu.npu.device(device):
            stream = super().__new__(cls, priority=priority, **kwargs)
        if not kwargs:             # a new stream, made by the user's own line: reports name it by that line
            site = callsite.direct_user_site(2)
            if site is not None:
                current().stream_made_at(stream._state, site)
        return stream

    def wait_event(self, event) -> None:
        event.wait(self)

    def wait_stream(self, stream) -> None:
        stream = as_npu_stream(stream)
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        if event is None:
            event = Event()
        event.record(self)
        return event

    def set_data_preprocess_stream(self, is_data_preprocess_stream=False) -> None:
        pass

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.npu_stream)

    def __eq__(self, other):
        if isinstance(other, Stream):
            return self.device_index == other.device_index and self.stream_id == other.stream_id
        return False

    def __hash__(self):
        return hash((self.npu_stream, self.device))

    def __repr__(self):
        return f"<torch_npu.npu.Stream device={self.device} npu_stream={self.npu_stream:#x}>"


def as_npu_stream(stream):
    """``stream`` as a torch_npu ``Stream`` if it is a plain ``torch.Stream`` of the npu device (whose own
    ``record_event``/``wait_stream`` reach no NPU runtime here); anything else unchanged."""
    if _C._is_npu_torch_stream(stream):
        return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)
    return stream


class ExternalStream(Stream):
    """Wraps a stream made by another library; the emulator treats it as opaque."""

    def __new__(cls, stream_ptr, device=None, **kwargs):
        if kwargs.get("priority", 0) != 0:
            raise RuntimeError("Priority was explicitly set for an external stream" + pta_error(ErrCode.PARAM))
        if kwargs.get("is_sync_launch", 0):
            raise RuntimeError("is_sync_launch was explicitly set for an external stream" + pta_error(ErrCode.PARAM))
        with torch_npu.npu.device(device):
            return _C._NPUStreamBase.__new__(cls, stream_ptr=stream_ptr)


class SyncLaunchStream(_C._NPUStreamBase):
    """A stream that bypasses the task queue (not a ``Stream`` subclass, as in torch_npu)."""

    def __new__(cls, device=None, priority=0, **kwargs):
        with torch_npu.npu.device(device):
            return super().__new__(cls, priority=priority, is_sync_launch=1, **kwargs)

    wait_event = Stream.wait_event
    wait_stream = Stream.wait_stream
    record_event = Stream.record_event

    def __eq__(self, other):
        if isinstance(other, SyncLaunchStream):
            return self.device_index == other.device_index and self.stream_id == other.stream_id
        return False

    def __hash__(self):
        return hash((self.npu_stream, self.device))

    def __repr__(self):
        return f"<torch_npu.npu.SyncLaunchStream device={self.device} npu_stream={self.npu_stream:#x}>"


class Event(_C._NPUEventBase):
    """An NPU event: a marker in a stream that other streams (or the host) can wait for."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        super().__init__(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    @classmethod
    def from_ipc_handle(cls, device, handle):
        return cls()

    def record(self, stream=None) -> None:
        super().record(stream)

    def wait(self, stream=None) -> None:
        super().wait(stream)

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.npu_event)

    def __repr__(self):
        if self.npu_event:
            return f"<torch_npu.npu.Event {self._as_parameter_.value:#x}>"
        return "<torch_npu.npu.Event uninitialized>"


class ExternalEvent(_C._NPUEventBase):
    """An event whose wait may precede its record; it must be ``reset()`` before reuse."""

    _label = "ExternalEvent"

    def __init__(self):
        super().__init__(enable_timing=False, blocking=False, interprocess=False, graph_external=True)

    def reset(self, stream=None) -> None:
        """Clear the record so the event can be reused (its stream's tasks must be done)."""
        super().reset(stream)

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.npu_event)

    def __repr__(self):
        if self.npu_event:
            return f"<torch_npu.npu.ExternalEvent {self._as_parameter_.value:#x}>"
        return "<torch_npu.npu.ExternalEvent uninitialized>"
