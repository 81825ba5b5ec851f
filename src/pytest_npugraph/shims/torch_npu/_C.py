"""Emulated ``torch_npu._C``: the boundary between torch_npu's Python layer and the runtime.

The real module is C++; here each function forwards to the per-test emulated runtime, with
torch_npu's checks and messages.  The Python modules of this package call only these, in the
same places the real ones call the C++ extension.
"""
from __future__ import annotations

import torch

from pytest_npugraph import trace as T
from pytest_npugraph.runtime import runtime as _runtime
from pytest_npugraph.runtime.errors import ErrCode, pta_error

from . import _args

PRIVATEUSE1 = 20   # c10::DeviceType::PrivateUse1


def _rt():
    return _runtime.current()


# ----------------------------------------------------------------------- devices
def _npu_getDeviceCount() -> int:
    return len(_rt().devices)


def _check_device(index: int, call: str = "aclrtSetDevice"):
    rt = _rt()
    rt.check_device(index, call)
    return rt


def _npu_setDevice(index: int) -> None:
    if index < 0:
        raise RuntimeError("device id must be positive!" + pta_error(ErrCode.VALUE))
    rt = _check_device(index)
    rt.set_current_device(index)
    rt.devices[index].initialized = True


def _npu_getDevice() -> int:
    rt = _rt()
    index = rt.current_device()
    rt.devices[index].initialized = True
    return index


def _npu_init() -> None:
    """``torch_npu.npu._lazy_init``: this test's NPU state is initialised from here on."""
    rt = _rt()
    rt.extensions["torch_npu.initialized"] = True
    if _npu_getDeviceWithoutSet() < 0:
        rt.set_current_device(rt.current_device())   # initialisation sets the thread's device
    _npu_getDevice()


def _npu_isInitialized() -> bool:
    """Whether this test initialised the NPU (lazily, or by activating a device through use)."""
    rt = _runtime.peek()
    return rt is not None and (rt.extensions.get("torch_npu.initialized", False)
                               or any(d.initialized for d in rt.devices))


def _npu_getLocalDevice() -> int:
    """The calling thread's device, -1 when none was set."""
    return -1 if _runtime.peek() is None else _npu_getDeviceWithoutSet()


def _npu_getDeviceWithoutSet() -> int:
    return _rt().local_device()


def _npu_maybeExchangeDevice(index: int) -> int:
    previous = _npu_getDeviceWithoutSet()
    if index >= 0:
        _npu_setDevice(index)
    return previous


def _npu_synchronize() -> None:
    rt = _rt()
    rt.host_sync("device", device=rt.current_device())


def _device_initialized(index: int, what: str):
    rt = _rt()
    device = rt.devices[index]
    if not device.initialized:
        raise RuntimeError(f"NPU device {index} has not been initialized! Can not {what} device resource limit")
    return rt, device


def _record_limit(rt, stream_or_device, what):
    """Tell the trace the limits now in force (the effective cube, vector)."""
    if what == "device":
        d = stream_or_device
        cube, vector = d.device_limits()
        rt.marker(T.DeviceLimit, device=d.index, cube=cube, vector=vector)
    else:
        s = stream_or_device
        cube, vector = rt.devices[s.device].stream_limits(s)
        rt.marker(T.StreamLimit, s, cube=cube, vector=vector)


def _npu_set_device_res_limit(device, type, value) -> None:
    device, type, value = _args.unpack_long(device), _args.unpack_long(type), _args.unpack_uint32(value)
    rt, d = _device_initialized(device, "get")
    if type == 0:
        d.cube_limit = value
    else:
        d.vector_limit = value
    _record_limit(rt, d, "device")


def _npu_get_device_res_limit(device, type) -> int:
    device, type = _args.unpack_long(device), _args.unpack_long(type)
    _, d = _device_initialized(device, "get")
    return d.device_limits()[0 if type == 0 else 1]


# ------------------------------------------------------------------------ memory
def _allocator(index: int):
    return _check_device(index, "aclrtGetMemInfo").devices[index].allocator


def _npu_emptyCache() -> None:
    for device in _rt().devices:
        device.allocator.empty_cache()


def _raw_blocks(rt) -> dict:
    return rt.extensions.setdefault("torch_npu.raw_blocks", {})


def _npu_npuCachingAllocator_raw_alloc(size, stream_ptr) -> int:
    if not isinstance(size, int) or not isinstance(stream_ptr, int):     # THPUtils_checkLong, then invalidArguments
        got = ", ".join("None" if a is None else type(a).__name__ for a in (size, stream_ptr))
        raise TypeError(f"caching_allocator_alloc received an invalid combination of arguments - got ({got}), but "
                        "expected (ssize_t size, intptr_t stream)")
    rt = _rt()
    device = rt.device()
    state = next((s for s in device.streams.values() if _stream_ptr(s) == stream_ptr), None)
    if state is None:
        state = rt.current_stream()
    block = device.allocator.malloc(size, state.sid)
    rt.on_alloc(block)
    _raw_blocks(rt)[block.lo] = block
    return block.lo


def _npu_npuCachingAllocator_raw_delete(ptr: int) -> None:
    if not ptr:
        return
    block = _raw_blocks(_rt()).pop(ptr, None)
    if block is None:
        raise RuntimeError(f"invalid device pointer: {ptr:#x}" + pta_error(ErrCode.PARAM))
    block.allocator.free(block)


_BLOCK_STATES = {(True, False): "active_allocated", (False, True): "active_pending_free",
                 (False, False): "inactive"}


def _npu_memorySnapshot(mempool_id=None) -> dict:
    """The allocator state of every device, shaped like torch_npu's ``memory._snapshot()``."""
    rt = _rt()
    segments = []
    for device in rt.devices:
        for seg in device.allocator.segments:
            pool = seg.pool if isinstance(seg.pool, tuple) else (0, 0)
            if mempool_id is not None and tuple(mempool_id) != pool:
                continue
            info = rt.trace.streams.get(seg.stream)
            blocks = [{"address": c.lo, "size": c.size, "requested_size": c.requested,
                       "state": _BLOCK_STATES[(c.allocated, c.pending)], "frames": []}
                      for c in seg.blocks]
            segments.append({
                "device": device.index, "address": seg.lo, "total_size": seg.size,
                "stream": 0 if info is None else _stream_ptr(device.stream_by_id(info.stream_id)),
                "segment_type": "small" if seg.small else "large", "segment_pool_id": pool,
                "is_expandable": False, "frames": [], "blocks": blocks,
                "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                "requested_size": sum(b["requested_size"] for b in blocks),
            })
    return {"segments": segments, "device_traces": [[] for _ in rt.devices]}


# ----------------------------------------------------------------------- streams
def _is_npu_torch_stream(stream) -> bool:
    """A plain ``torch.Stream`` naming an npu stream (``torch.accelerator.current_stream()``, the stream
    objects Dynamo hands its ``streams::`` ops): it names the same stream as the torch_npu handle."""
    return type(stream) is torch.Stream and stream.device_type == PRIVATEUSE1


def _stream_state(stream_id: int, device_index: int, device_type: int = PRIVATEUSE1):
    return _rt().stream_by_id(device_index, stream_id)


def _npu_getCurrentStream(device: int):
    rt = _check_device(device, "aclrtGetCurrentStream")
    s = rt.current_stream(device)
    return (s.stream_id, s.device, PRIVATEUSE1)


def _npu_getDefaultStream(device: int):
    rt = _check_device(device, "aclrtGetDefaultStream")
    s = rt.devices[device].default_stream
    return (s.stream_id, s.device, PRIVATEUSE1)


def _npu_setStream(stream_id: int, device_index: int, device_type: int = PRIVATEUSE1) -> None:
    state = _stream_state(stream_id, device_index, device_type)
    rt = _rt()
    if device_index != rt.current_device():
        _npu_setDevice(device_index)
    rt.set_current_stream(state)


def _npu_set_stream_res_limit(stream_id, device_index, device_type, type, value) -> None:
    stream_id, device_index, device_type, type, value = _args.pybind_parse(
        (stream_id, device_index, device_type, type, value), "LLLOO")
    state = _stream_state(stream_id, device_index, device_type)
    type, value = _args.unpack_long(type), _args.unpack_uint32(value)
    rt = _rt()
    device = rt.devices[device_index]
    if rt.thread().restoring_limits and value == (device.cube_cores if type == 0 else device.vector_cores):
        value = None                    # TorchAir's restore after a scope: back to no limit
    if type == 0:
        state.cube_limit = value
    else:
        state.vector_limit = value
    _record_limit(rt, state, "stream")


def _npu_get_stream_res_limit(stream_id, device_index, device_type, type) -> int:
    stream_id, device_index, device_type, type = _args.pybind_parse(
        (stream_id, device_index, device_type, type), "LLLO")
    state = _stream_state(stream_id, device_index, device_type)
    type = _args.unpack_long(type)
    rt = _rt()
    return rt.devices[device_index].stream_limits(state)[0 if type == 0 else 1]


def _npu_reset_stream_res_limit(stream_id, device_index, device_type) -> None:
    stream_id, device_index, device_type = _args.pybind_parse((stream_id, device_index, device_type), "LLL")
    state = _stream_state(stream_id, device_index, device_type)
    state.cube_limit = state.vector_limit = None
    _record_limit(_rt(), state, "stream")


def _stream_ptr(state) -> int:
    """The ``aclrtStream`` a stream handle reports (the wrapped pointer for an external stream)."""
    if state.external:
        return state.pointer
    return 0xA5C0_0000_0000 + state.device * 0x1_0000_0000 + state.stream_id * 0x100


def _external_error(api: str) -> RuntimeError:
    return RuntimeError(f"External NPU stream is not supported in {api}. This path requires a torch_npu-managed "
                        "stream." + pta_error(ErrCode.NOT_SUPPORT))


class _NPUStreamBase(torch.Stream):
    """A handle to an emulated stream, identified like the real one by (device, stream_id)."""

    _SPEC = (("priority", "i", 0), ("is_sync_launch", "i", 0), ("stream_id", "L", 0), ("device_index", "L", 0),
             ("device_type", "L", 0), ("stream_ptr", "K", 0))

    def __new__(cls, *args, **kwargs):
        a = _args.parse("_NPUStreamBase", cls._SPEC, args, kwargs)
        priority, is_sync_launch, stream_ptr = a["priority"], a["is_sync_launch"], a["stream_ptr"]
        stream_id, device_index, device_type = a["stream_id"], a["device_index"], a["device_type"]
        rt = _rt()
        if stream_id or device_index or device_type:
            state = _stream_state(stream_id, device_index, device_type)
        elif stream_ptr:
            state = rt.device().external_stream(stream_ptr)
        elif is_sync_launch:
            state = rt.device().sync_launch_stream()
        else:
            state = rt.device().pool_stream(priority)
        return super().__new__(cls, stream_id=state.stream_id, device_index=state.device,
                               device_type=PRIVATEUSE1)

    @property
    def _state(self):
        return _stream_state(self.stream_id, self.device_index)

    @property
    def npu_stream(self) -> int:
        return _stream_ptr(self._state)

    def query(self) -> bool:
        state = self._state
        if state.external:
            raise RuntimeError("Cannot query external NPU stream status. The caller must track stream "
                               "completion externally.")
        rt = _rt()
        rt.refuse_sync_in_capture("stream", state.device, state, call="query")
        return rt.query(stream=state)

    def synchronize(self) -> None:
        state = self._state
        if state.external:
            raise RuntimeError("External NPU stream is not supported in NPUStream::synchronize. The caller is "
                               "responsible for synchronization of external streams.")
        rt = _rt()
        rt.refuse_sync_in_capture("stream", state.device, state, call="synchronize")
        rt.host_sync("stream", device=state.device, stream=state)

    @property
    def priority(self):
        raise RuntimeError("NPU dose not support Stream.get_priority() currently." + pta_error(ErrCode.NOT_SUPPORT))

    @staticmethod
    def priority_range():
        raise RuntimeError("NPU does not support Stream.priority_range() currently." + pta_error(ErrCode.NOT_SUPPORT))


class _NPUEventBase(torch.Event):
    """A handle to an emulated event; the device-side event is created at the first record.  A
    ``torch.Event`` subclass as in torch_npu, so Dynamo traces it as an event inside compiled regions."""

    _label = "Event"

    _SPEC = (("enable_timing", "b", 0), ("blocking", "b", 0), ("interprocess", "b", 0), ("graph_external", "b", 0))

    def __init__(self, *args, **kwargs):
        a = _args.parse("_NPUEventBase", self._SPEC, args, kwargs)
        enable_timing, interprocess, graph_external = a["enable_timing"], a["interprocess"], a["graph_external"]
        if interprocess and enable_timing:
            raise RuntimeError("Parameter interprocess cannot be specified together with other parameters."
                               + pta_error(ErrCode.PARAM))
        self._flags = (bool(graph_external), bool(enable_timing))
        self._owner = None                   # the runtime (test) whose event self._state is
        self._live()

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls, device="npu")

    def _live(self):
        """The event's state in the running test (an event made by an earlier test starts over)."""
        rt = _rt()
        if self._owner is not rt:
            external, timing = self._flags
            self._state = rt.new_event(self._label, external=external, enable_timing=timing)
            self._owner = rt
        return rt, self._state

    def _stream(self, stream, method: str):
        rt = _rt()
        if stream is None:
            return rt.current_stream()
        if not _is_npu_torch_stream(stream):
            _args.require(stream, _NPUStreamBase, method, "stream", "torch_npu.npu.Stream")
        return _stream_state(stream.stream_id, stream.device_index)

    def record(self, stream=None):
        s = self._stream(stream, "record")
        rt, state = self._live()
        if s.external:
            raise _external_error("NPUEvent::record")
        if state.device is not None and state.device != s.device:
            raise RuntimeError(f"Event device {state.device} does not match recording stream's device {s.device}."
                               + pta_error(ErrCode.PARAM))
        rt.record_event(state, s)

    def wait(self, stream=None):
        s = self._stream(stream, "wait")
        rt, state = self._live()
        if s.external:
            raise _external_error("NPUEvent::block")
        if state.external and state.device is None:
            state.device = s.device     # an external event is created by its first wait, too
        rt.wait_event(state, s)

    def reset(self, stream=None):
        rt, state = self._live()
        if not state.external:
            raise RuntimeError("API reset() only support ACL_EVENT_EXTERNAL flag event." + pta_error(ErrCode.PARAM))
        s = self._stream(stream, "reset")
        rt.marker(T.EventReset, s, event=state.eid)
        state.record_stream = None
        state.record_mark = -1
        state.waits_since_record = 0

    def query(self) -> bool:
        rt, state = self._live()
        if state.recorded:
            rt.refuse_sync_in_capture("event", state.device, event=state)
        return rt.query(event=state)

    def synchronize(self) -> None:
        rt, state = self._live()
        if state.recorded:
            rt.host_sync("event", device=state.device, event=state)

    def elapsed_time(self, end_event) -> float:
        _args.require(end_event, _NPUEventBase, "elapsed_time", "end_event", "torch_npu.npu.Event")
        rt, state = self._live()
        _, end = end_event._live()
        if not (state.recorded and end.recorded):
            raise RuntimeError("Both events must be recorded before calculating elapsed time."
                               + pta_error(ErrCode.INTERNAL))
        self.synchronize()
        end_event.synchronize()
        return (end.record_time - state.record_time) * 1000.0

    def recorded_time(self) -> int:
        _, state = self._live()
        if not state.recorded:
            raise RuntimeError("Event must be recorded before getting recorded timestamp." + pta_error(ErrCode.INTERNAL))
        return int(state.record_time * 1e6)

    def ipc_handle(self) -> bytes:
        _, state = self._live()
        return state.eid.to_bytes(8, "little") * 8

    @property
    def device(self):
        _, state = self._live()
        return None if state.device is None else torch.device("npu", state.device)

    @property
    def npu_event(self) -> int:
        _, state = self._live()
        return 0 if state.device is None else 0xE7E0_0000_0000 + state.eid * 0x40


# ----------------------------------------------------------------------- graph task groups
class _NPUTaskGroupHandle:
    """What ``torch.npu.graph_task_group_end`` returns: names the task group (``.task_group``, the trace
    position of its end) that ``graph_task_update_begin(stream, handle)`` re-launches with new arguments."""

    def __init__(self, task_group):
        self.task_group = task_group

    def __repr__(self):
        return f"<torch_npu._C._NPUTaskGroupHandle task_group={self.task_group}>"


# ------------------------------------------------------------------------- tensors
def _weak_ref_tensor(tensor):
    """A tensor over ``tensor``'s memory (same storage, sizes, strides and offset) that torch_npu builds
    without taking a reference to the block.  Here it is a view sharing the block: the emulated block
    stays alive while the view does (the caching allocator would keep the memory mapped anyway)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"_weak_ref_tensor(): argument 'tensor' must be Tensor, not {type(tensor).__name__}")
    return tensor.as_strided(tensor.size(), tensor.stride(), tensor.storage_offset())


# ---------------------------------------------------------------------------- SoC
# c10_npu::SocVersion of each emulated chip (torch_npu/csrc/core/npu/NPUVariables.h)
_SOC_VERSIONS = {
    "Ascend910B1": 220, "Ascend910B2": 221, "Ascend910B2C": 222, "Ascend910B3": 223, "Ascend910B4": 224,
    "Ascend910B4-1": 225, "Ascend910_9391": 250, "Ascend910_9392": 251, "Ascend910_9381": 252,
    "Ascend910_9382": 253, "Ascend910_9372": 254, "Ascend910_9362": 255,
}


def _npu_get_soc_version() -> int:
    return _SOC_VERSIONS.get(_rt().device().profile.name, -1)


def _npu_setOption(option: dict) -> None:
    """``torch_npu._C._npu_setOption``: runtime switches, kept per test (``npu_config._options``)."""
    from .npu import npu_config

    if not isinstance(option, dict):
        raise TypeError(f"_npu_setOption(): argument must be dict, not {type(option).__name__}")
    npu_config._options().update({str(k): str(v) for k, v in option.items()})
