"""An as-soon-as-possible schedule of a trace: when each task could start and end.

Only for pictures.  Streams run their tasks in order; a task starts when its stream is free, its
device's host thread has issued it, and every event its stream waited on has fired; the members of
one collective (matched across devices by ``Kernel.collective``) start together, when the last of
them could.  Durations are a rough cost model (a fixed launch cost plus bytes touched); each device
has its own host thread (``run_ranks`` drives one device per thread), which issues records one
after another and blocks at synchronisations.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from .. import trace as T

LAUNCH_US = 2.0          # host cost of issuing one task
KERNEL_US = 5.0          # fixed device cost of a kernel
BYTES_PER_US = 200_000   # ~200 GB/s of memory traffic
ROUNDS = 8               # relaxation rounds for collectives (each round settles one more level)


@dataclass(frozen=True)
class Slot:
    seq: int
    stream: Optional[int]   # None: the whole device (a device sync, a marker without a stream)
    start: float
    end: float


def _cost(k: T.Kernel) -> float:
    touched = sum(s.hi - s.lo for s in k.reads) + sum(s.hi - s.lo for s in k.writes)
    return KERNEL_US + touched / BYTES_PER_US


def schedule(trace: T.Trace) -> dict:
    """seq -> Slot for every record of the trace: device tasks (Kernel, EventRecord, EventWait) when
    they run; host-side records (syncs, markers, allocations) at the time the host reached them,
    on the stream they concern (``stream`` None: the whole device)."""
    floors: dict = {}
    for _ in range(ROUNDS):
        slots, ready = _pass(trace, floors)
        settled = {key: max(times) for key, times in ready.items() if len(times) > 1}
        if settled == floors:
            break
        floors = settled
    return slots


def _pass(trace: T.Trace, floors: dict):
    """One pass in record order; collectives start no earlier than ``floors[(group, seq)]``.
    Returns the slots and, per collective, the time each member could have started alone."""
    host: dict = defaultdict(float)   # device -> time its host thread is at
    stream_free: dict = {}            # sid -> time its last task ends
    event_time: dict = {}             # eid -> time its latest record fires
    ready = defaultdict(list)
    slots: dict = {}
    for r in trace.records:
        if isinstance(r, (T.Kernel, T.EventRecord, T.EventWait)):
            device = trace.streams[r.stream].device
            host[device] += LAUNCH_US
            t = max(host[device], stream_free.get(r.stream, 0.0))
            if isinstance(r, T.EventWait):
                t = max(t, event_time.get(r.event, 0.0))
            end = t
            if isinstance(r, T.Kernel):
                if r.collective is not None:
                    ready[r.collective].append(t)
                    t = max(t, floors.get(r.collective, 0.0))
                end = t + _cost(r)
            elif isinstance(r, T.EventRecord):
                event_time[r.event] = t
            stream_free[r.stream] = end
            slots[r.seq] = Slot(r.seq, r.stream, t, end)
        elif isinstance(r, T.HostSync):
            if r.what == "device":
                waited = [t for sid, t in stream_free.items() if trace.streams[sid].device == r.device]
            elif r.stream is not None:
                waited = [stream_free.get(r.stream, 0.0)]
            else:
                waited = [event_time.get(r.event, 0.0)]
            device = trace.streams[r.stream].device if r.stream is not None else r.device
            host[device] = max([host[device]] + waited)
            slots[r.seq] = Slot(r.seq, r.stream, host[device], host[device])
        else:
            stream = _host_record_stream(trace, r)
            at = host[trace.streams[stream].device if stream is not None else 0]
            slots[r.seq] = Slot(r.seq, stream, at, at)
    return slots, ready


def _host_record_stream(trace: T.Trace, r):
    if isinstance(r, T.Marker):
        return r.stream if r.stream in trace.streams else None
    if isinstance(r, T.RecordStream):
        return r.stream
    block = trace.blocks.get(r.block)          # Alloc, Free: the block's allocation stream
    return block.stream if block is not None and block.stream in trace.streams else None
