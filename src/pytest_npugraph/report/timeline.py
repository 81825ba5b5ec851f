"""Chrome-trace JSON of a test's emulated schedule (opens in Perfetto or chrome://tracing).

A process per device, a thread (track) per stream; kernels as slices with their op, cores, limits,
graph and the user's line; event record -> wait and the members of each collective (across
devices) as flow arrows; host syncs and runtime markers (graph capture, limits) as instants; hazards
as instant markers carrying their kind, status and message.  ``otherData`` holds the hazard list and
the stream table, so one JSON file is everything a viewer (report/html.py) needs.
"""
from __future__ import annotations

import json
from collections import defaultdict

from .. import trace as T
from .schedule import schedule

HOST_MARKERS = (T.DeviceCores,)      # markers not worth a mark on the timeline
COLLECTIVE_IDS = 1 << 40        # flow ids of collectives, apart from event flows (record seqs)
DEVICE_TASKS = (T.Kernel, T.EventRecord, T.EventWait)


def chrome_trace(trace: T.Trace, hazards=(), status=None, max_tasks=None) -> dict:
    """The Chrome-trace dict.  ``status``: hazard key -> "failed"/"expected"/...; ``max_tasks``: keep
    only the first that many device tasks (plus every task a hazard names) for big traces."""
    slots = schedule(trace)
    keep = _kept(trace, hazards, max_tasks)
    events = _metadata(trace)
    last_record: dict = {}
    members = defaultdict(list)
    for r in trace.records:
        slot = slots.get(r.seq)
        if slot is None or (keep is not None and r.seq not in keep):
            continue
        if isinstance(r, T.Kernel):
            events.append(_slice(trace, r, slot))
            if r.collective is not None:
                members[r.collective].append((r, slot))
        elif isinstance(r, T.EventRecord):
            last_record[r.event] = r
            events += _event_mark(trace, r, slot, "record", {})
            events.append({"ph": "s", "id": r.seq, "name": "event", "cat": "event", **_at(trace, r.stream, slot)})
        elif isinstance(r, T.EventWait):
            rec = last_record.get(r.event)
            events += _event_mark(trace, r, slot, "wait", {"recorded": rec is not None})
            if rec is not None:
                events.append({"ph": "f", "bp": "e", "id": rec.seq, "name": "event", "cat": "event",
                               **_at(trace, r.stream, slot)})
        elif isinstance(r, T.HostSync):
            events.append(_instant(trace, slot, r.device, f"sync {r.what}", "sync", {"where": str(r.site)}))
        elif isinstance(r, T.Marker) and not isinstance(r, HOST_MARKERS):
            events.append(_instant(trace, slot, 0, r.what, "marker",
                                   {"where": str(r.site), "detail": [str(d) for d in r.facts().values()]}))
        elif isinstance(r, T.RecordStream):
            events.append(_instant(trace, slot, 0, "record_stream", "memory",
                                   {"where": str(r.site), "allocated at": _alloc_site(trace, r.block)}))
    events += _collective_flows(trace, members)
    events += _hazard_marks(trace, hazards, slots, status or {})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"hazards": [_hazard_entry(h, status or {}) for h in hazards],
                          "streams": {str(i.sid): i.name for i in trace.streams.values()},
                          "truncated": keep is not None}}


def write(path, trace: T.Trace, hazards=(), status=None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(trace, hazards, status), f)


def task_count(trace: T.Trace) -> int:
    """Device tasks (kernels, event records and waits): what ``max_tasks`` counts."""
    return sum(isinstance(r, DEVICE_TASKS) for r in trace.records)


# ----------------------------------------------------------------------------- parts
def _kept(trace: T.Trace, hazards, max_tasks):
    tasks = [r.seq for r in trace.records if isinstance(r, DEVICE_TASKS)]
    if max_tasks is None or len(tasks) <= max_tasks:
        return None
    keep = set(tasks[:max_tasks])
    last = tasks[max_tasks - 1]
    keep.update(r.seq for r in trace.records[:last + 1])        # host records among the kept tasks
    keep.update(s for h in hazards for s in h.seqs)
    return keep


def _metadata(trace: T.Trace) -> list:
    events = []
    for device in sorted({i.device for i in trace.streams.values()}):
        events.append({"ph": "M", "name": "process_name", "pid": device, "args": {"name": f"npu:{device}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": device, "args": {"sort_index": device}})
    for sid, info in trace.streams.items():
        events.append({"ph": "M", "name": "thread_name", "pid": info.device, "tid": sid, "args": {"name": info.name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": info.device, "tid": sid,
                       "args": {"sort_index": sid}})
    return events


def _at(trace: T.Trace, sid: int, slot) -> dict:
    return {"pid": trace.streams[sid].device, "tid": sid, "ts": slot.start}


def _slice(trace: T.Trace, k: T.Kernel, slot) -> dict:
    args = {"op": k.op, "where": str(k.site), "kind": k.cores.kind, "cube": k.cores.cube, "vector": k.cores.vector,
            "all_resident": k.cores.all_resident, "limit_applies": k.cores.limit_applies,
            "cube_limit": k.cube_limit, "vector_limit": k.vector_limit, "graph": None if k.graph is None else str(k.graph), "seq": k.seq,
            "read_bytes": sum(s.hi - s.lo for s in k.reads), "written_bytes": sum(s.hi - s.lo for s in k.writes)}
    if k.collective is not None:
        args["collective"] = f"{k.collective[0]}#{k.collective[1]}"
    cat = k.cores.kind + (",graph" if k.graph else "") + (",collective" if k.collective else "")
    return {"ph": "X", "name": k.op.split("::")[-1], "cat": cat, "dur": slot.end - slot.start, "args": args,
            **_at(trace, k.stream, slot)}


def _event_mark(trace: T.Trace, r, slot, verb: str, extra: dict) -> list:
    label = trace.events[r.event].label if r.event in trace.events else f"event {r.event}"
    return [{"ph": "i", "s": "t", "name": f"{verb} {label}", "cat": verb, "args": {"where": str(r.site), **extra},
             **_at(trace, r.stream, slot)}]


def _instant(trace: T.Trace, slot, device: int, name: str, cat: str, args: dict) -> dict:
    if slot.stream is not None:
        return {"ph": "i", "s": "t", "name": name, "cat": cat, "args": args, **_at(trace, slot.stream, slot)}
    return {"ph": "i", "s": "p", "name": name, "cat": cat, "args": args, "pid": device, "tid": 0, "ts": slot.start}


def _alloc_site(trace: T.Trace, bid: int) -> str:
    block = trace.blocks.get(bid)
    return str(block.site) if block is not None else "?"


def _collective_flows(trace: T.Trace, members: dict) -> list:
    """One flow chain per collective through its members on every device (s -> t... -> f)."""
    events = []
    for n, (key, parts) in enumerate(sorted(members.items(), key=lambda kv: kv[1][0][0].seq)):
        if len(parts) < 2:
            continue
        for i, (k, slot) in enumerate(sorted(parts, key=lambda p: trace.streams[p[0].stream].device)):
            ph = "s" if i == 0 else "f" if i == len(parts) - 1 else "t"
            event = {"ph": ph, "id": COLLECTIVE_IDS + n, "name": f"{key[0]}#{key[1]}", "cat": "collective",
                     **_at(trace, k.stream, slot)}
            if ph == "f":
                event["bp"] = "e"
            events.append(event)
    return events


def _hazard_marks(trace: T.Trace, hazards, slots: dict, status: dict) -> list:
    events, placed = [], set()
    for n, h in enumerate(hazards):
        for seq in h.seqs:
            slot = slots.get(seq)
            if slot is None or slot.stream not in trace.streams or (n, slot.stream, slot.start) in placed:
                continue
            placed.add((n, slot.stream, slot.start))
            events.append({"ph": "i", "s": "t", "name": f"HAZARD {h.kind}", "cat": "hazard",
                           "args": {"hazard": n, "status": status.get(h.key, "found"), "message": h.message,
                                    "where": list(h.where)},
                           **_at(trace, slot.stream, slot)})
    return events


def _hazard_entry(h, status: dict) -> dict:
    return {"kind": h.kind, "status": status.get(h.key, "found"), "severity": h.severity, "message": h.message,
            "where": list(h.where), "streams": list(h.streams), "ops": list(h.ops)}
