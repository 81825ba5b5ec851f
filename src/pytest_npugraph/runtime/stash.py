"""Per-test state of the emulated runtime, typed, in one place.

Why: the runtime is rebuilt for every test (``runtime.current()``), but module globals, compiled
graphs and handles the user keeps (events, graphs, the torch_npu registries) outlive it.  Their
per-test state lives in the runtime's ``Stash`` instead of next to them with a "which test was
this?" check each: a new test finds an empty stash, so nothing leaks and nothing needs resetting.

A handle the user keeps (an event) holds its state with the runtime it belongs to and starts over
when it is used under another runtime.  ``ThreadState`` is what each host thread of a test holds
(current device and streams, compiled-graph site hint, its ``run_ranks`` rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Stash:
    """The running test's state of objects that outlive it, one typed field each.

    Fields rather than a keyed dict: torch.compile traces shims that read them (tagged events and
    streams inside a compiled forward) and guards on what it read; a field keeps that guard to the
    one registry, stable while the test runs."""

    called_once: set = field(default_factory=set)     # torch_npu call-once functions called (set_device_limit)
    capture_stream: Any = None                          # graph's default capture stream (torch.npu.graph)
    tag_streams: dict = field(default_factory=dict)     # torchair tag -> tagged stream (_GLOBAL_TAG_TO_STREAM)
    tag_events: Any = None                              # torchair's tag <-> tagged event registry


@dataclass
class ThreadState:
    """What one host thread of the running test has chosen (per test: it lives in the runtime)."""

    device: Optional[int] = None                 # set_device; None = never set (device 0)
    streams: dict = field(default_factory=dict)  # device -> its current StreamState
    site: Any = None                             # the compiled graph node's line for work issued now
    rank: Optional[tuple] = None                 # (collectives.Job, rank) inside npugraph.run_ranks
    restoring_limits: bool = False               # inside restored_limits(): a limit back at the maximum is none
    events_made: int = 0                         # events this thread made: their labels' numbers
    stream_history: dict = field(default_factory=dict)   # device -> [(autograd sequence nr, StreamState)]
    mem_pools: dict = field(default_factory=dict)        # device -> pool id torch.npu.use_mem_pool routes into
