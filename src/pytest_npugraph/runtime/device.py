"""An emulated Ascend device: chip profile, core limits, its streams and its allocator."""
from __future__ import annotations

from .allocator import CachingAllocator
from .errors import ErrCode, pta_error
from .streams import (DEFAULT_ID, EXTERNAL_BIT, HIGH_POOL_BASE, NORMAL_POOL_BASE, POOL_SIZE, SYNC_LAUNCH_BASE,
                      StreamState)


class Device:
    def __init__(self, index: int, profile, runtime):
        self.index = index
        self.profile = profile
        self.runtime = runtime
        self.allocator = CachingAllocator(index, profile.hbm_bytes, runtime)
        self.streams: dict = {}            # stream_id -> StreamState
        self._next_in_pool = {0: 0, 1: 0, 2: 0}
        self.cube_limit = None             # set_device_limit; None = the whole chip
        self.vector_limit = None
        self.initialized = False           # activated in this process (torch_npu lazy init)
        self.profiles: dict = {}           # op name -> OpCores (profiles.resolve's cache, per test)
        self.default_stream = self._stream(DEFAULT_ID, "default")

    @property
    def cube_cores(self) -> int:
        return self.profile.cube_cores

    @property
    def vector_cores(self) -> int:
        return self.profile.vector_cores

    def _stream(self, stream_id: int, name: str, **kw) -> StreamState:
        state = self.streams.get(stream_id)
        if state is None:
            state = self.runtime.new_stream(self.index, stream_id, f"npu:{self.index}/{name}", **kw)
            self.streams[stream_id] = state
        return state

    def pool_stream(self, priority: int = 0) -> StreamState:
        """Round-robin over 32 streams per priority level, as torch_npu's stream pools do."""
        level = min(max(-priority, 0), 1)
        i = self._next_in_pool[level]
        self._next_in_pool[level] = (i + 1) % POOL_SIZE
        base = HIGH_POOL_BASE if level else NORMAL_POOL_BASE
        name = f"stream-{i}" if not level else f"high-priority-stream-{i}"
        return self._stream(base + i, name, priority=-level)

    def sync_launch_stream(self) -> StreamState:
        i = self._next_in_pool[2]
        self._next_in_pool[2] = (i + 1) % 4
        return self._stream(SYNC_LAUNCH_BASE + i, f"sync-launch-{i}")

    def external_stream(self, pointer: int) -> StreamState:
        """The stream wrapping ``pointer`` (one per pointer and device, id ``(1 << 30) | i``)."""
        externals = [s for s in self.streams.values() if s.external]
        for s in externals:
            if s.pointer == pointer:
                return s
        return self._stream(EXTERNAL_BIT | len(externals), f"external-{pointer:#x}", external=True,
                            pointer=pointer)

    def stream_by_id(self, stream_id: int) -> StreamState:
        """The stream a handle's id names (pool streams exist from the start, as on hardware)."""
        state = self.streams.get(stream_id)
        if state is not None:
            return state
        kind, index = stream_id >> 5, stream_id & 31
        if not stream_id & EXTERNAL_BIT:
            if kind == NORMAL_POOL_BASE >> 5 and index < POOL_SIZE:
                return self._stream(stream_id, f"stream-{index}")
            if kind == HIGH_POOL_BASE >> 5 and index < POOL_SIZE:
                return self._stream(stream_id, f"high-priority-stream-{index}", priority=-1)
            if kind == SYNC_LAUNCH_BASE >> 5 and index < 4:
                return self._stream(stream_id, f"sync-launch-{index}")
        raise RuntimeError(
            f"Invalid stream index {stream_id}. Uninitialized NPU stream {stream_id}, Did you manufacture the "
            "StreamId yourself?  Don't do that; use the official API like c10_npu::getStreamFromPool() to get "
            "a new stream." + pta_error(ErrCode.PARAM))

    def device_limits(self) -> tuple:
        return (self.cube_limit if self.cube_limit is not None else self.cube_cores,
                self.vector_limit if self.vector_limit is not None else self.vector_cores)

    def explicit_limits(self, stream: StreamState) -> tuple:
        """The limits a kernel on ``stream`` runs under, 0 where nobody set one (what traces record)."""
        cube, vector = stream.cube_limit, stream.vector_limit
        if cube is None:
            cube = self.cube_limit or 0
        if vector is None:
            vector = self.vector_limit or 0
        return cube, vector

    def stream_limits(self, stream: StreamState) -> tuple:
        cube, vector = self.device_limits()
        return (stream.cube_limit if stream.cube_limit is not None else cube,
                stream.vector_limit if stream.vector_limit is not None else vector)
