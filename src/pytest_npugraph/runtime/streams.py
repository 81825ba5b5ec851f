"""Hardware-side state of streams and events (what the torch_npu objects are handles to)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

# torch_npu's stream_id encoding (torch_npu_api.md §2.1)
DEFAULT_ID = 0
SECONDARY_ID = 1 << 5
SYNC_LAUNCH_BASE = 2 << 5
NORMAL_POOL_BASE = 3 << 5
HIGH_POOL_BASE = 4 << 5
EXTERNAL_BIT = 1 << 30
POOL_SIZE = 32


@dataclass(eq=False)
class StreamState:
    sid: int
    device: int
    stream_id: int
    label: str
    priority: int = 0
    external: bool = False
    pointer: int = 0                    # the wrapped aclrtStream of an external stream
    cube_limit: Optional[int] = None    # the stream's own limit; None = inherit the device limit
    vector_limit: Optional[int] = None
    capture: Optional[object] = None    # the graph being captured on this stream
    physical_label: str = ""            # the pool stream's own label once the user's name replaced it


@dataclass(eq=False)
class EventState:
    eid: int
    label: str
    enable_timing: bool = False
    external: bool = False
    device: Optional[int] = None         # set by the first record (lazy creation, as torch_npu)
    record_stream: Optional[int] = None  # sid of the latest record
    record_mark: int = -1                # stream mark at the latest record
    record_time: Optional[float] = None
    waits_since_record: int = 0

    @property
    def recorded(self) -> bool:
        return self.record_stream is not None

    def stamp(self) -> None:
        self.record_time = time.perf_counter()
