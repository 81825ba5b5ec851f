"""Chrome-trace JSON of a test's emulated schedule (opens in Perfetto or chrome://tracing).

A process per device, a thread (track) per stream, kernels as slices with their op, cores and
the user's line, event record -> wait as flow arrows, hazards as instant markers.
"""
from __future__ import annotations

import json

from .. import trace as T
from .schedule import schedule


def chrome_trace(trace: T.Trace, hazards=()) -> dict:
    slots = schedule(trace)
    events = []
    for sid, info in trace.streams.items():
        events.append({"ph": "M", "name": "process_name", "pid": info.device, "args": {"name": f"npu:{info.device}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": info.device, "tid": sid, "args": {"name": info.label}})
    last_record: dict = {}
    for r in trace.records:
        slot = slots.get(r.seq)
        if slot is None:
            continue
        pid = trace.streams[r.stream].device
        if isinstance(r, T.Kernel):
            events.append({"ph": "X", "name": r.op.split("::")[-1], "cat": r.cores.kind, "pid": pid, "tid": r.stream,
                           "ts": slot.start, "dur": slot.end - slot.start,
                           "args": {"op": r.op, "where": str(r.site), "cube": r.cores.cube, "vector": r.cores.vector,
                                    "all_resident": r.cores.all_resident, "cube_limit": r.cube_limit,
                                    "vector_limit": r.vector_limit, "graph": r.graph, "seq": r.seq}})
        elif isinstance(r, T.EventRecord):
            last_record[r.event] = r
            label = trace.events[r.event].label if r.event in trace.events else f"event {r.event}"
            events.append({"ph": "i", "s": "t", "name": f"record {label}", "pid": pid, "tid": r.stream,
                           "ts": slot.start, "args": {"where": str(r.site)}})
            events.append({"ph": "s", "id": r.seq, "name": "event", "cat": "event", "pid": pid, "tid": r.stream,
                           "ts": slot.start})
        elif isinstance(r, T.EventWait):
            rec = last_record.get(r.event)
            label = trace.events[r.event].label if r.event in trace.events else f"event {r.event}"
            events.append({"ph": "i", "s": "t", "name": f"wait {label}", "pid": pid, "tid": r.stream,
                           "ts": slot.start, "args": {"where": str(r.site), "recorded": rec is not None}})
            if rec is not None:
                events.append({"ph": "f", "bp": "e", "id": rec.seq, "name": "event", "cat": "event", "pid": pid,
                               "tid": r.stream, "ts": slot.start})
    for h in hazards:
        for seq in h.seqs:
            slot = slots.get(seq)
            if slot is not None:
                events.append({"ph": "i", "s": "t", "name": f"HAZARD {h.kind}", "cat": "hazard",
                               "pid": trace.streams[slot.stream].device, "tid": slot.stream, "ts": slot.start,
                               "args": {"message": h.message}})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write(path, trace: T.Trace, hazards=()) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(trace, hazards), f)
