"""An as-soon-as-possible schedule of a trace: when each task could start and end.

Only for pictures.  Streams run their tasks in order; a task starts when its stream is free, the
host has issued it, and every event its stream waited on has fired.  Durations are a rough cost
model (a fixed launch cost plus bytes touched); the host issues records one after another and
blocks at synchronisations.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import trace as T

LAUNCH_US = 2.0          # host cost of issuing one task
KERNEL_US = 5.0          # fixed device cost of a kernel
BYTES_PER_US = 200_000   # ~200 GB/s of memory traffic


@dataclass(frozen=True)
class Slot:
    seq: int
    stream: int
    start: float
    end: float


def _cost(k: T.Kernel) -> float:
    touched = sum(s.hi - s.lo for s in k.reads) + sum(s.hi - s.lo for s in k.writes)
    return KERNEL_US + touched / BYTES_PER_US


def schedule(trace: T.Trace) -> dict:
    """seq -> Slot for every Kernel, EventRecord and EventWait of the trace."""
    host = 0.0
    stream_free: dict = {}     # sid -> time its last task ends
    event_time: dict = {}      # eid -> time its latest record fires
    slots: dict = {}
    for r in trace.records:
        host += LAUNCH_US
        if isinstance(r, T.Kernel):
            start = max(host, stream_free.get(r.stream, 0.0))
            end = start + _cost(r)
            stream_free[r.stream] = end
            slots[r.seq] = Slot(r.seq, r.stream, start, end)
        elif isinstance(r, T.EventRecord):
            t = max(host, stream_free.get(r.stream, 0.0))
            stream_free[r.stream] = t
            event_time[r.event] = t
            slots[r.seq] = Slot(r.seq, r.stream, t, t)
        elif isinstance(r, T.EventWait):
            t = max(host, stream_free.get(r.stream, 0.0), event_time.get(r.event, 0.0))
            stream_free[r.stream] = t
            slots[r.seq] = Slot(r.seq, r.stream, t, t)
        elif isinstance(r, T.HostSync):
            if r.what == "device":
                waited = [t for sid, t in stream_free.items() if trace.streams[sid].device == r.device]
            elif r.stream is not None:
                waited = [stream_free.get(r.stream, 0.0)]
            else:
                waited = [event_time.get(r.event, 0.0)]
            host = max([host] + waited)
    return slots
