"""ExternalEvent waits issued before their record: the order the device really runs them in.

Why: torch_npu lets ``ExternalEvent.wait(stream)`` come before ``ExternalEvent.record(...)``;
the wait holds its stream until the record happens (and runs).  Every other analysis reads
the trace in issue order, which is a topological order of happens-before only while each wait
follows its record.  ``effective(trace)`` gives them a trace whose order is one again: a
forward wait, and the work its stream was given after it, move after the record it waits for.

Binding: an ``EventWait`` on an external event that has no ``EventRecord`` before it (since
its latest ``EventReset``) waits for the event's next record in issue order.

Hazards (``find``):
* ``event-misuse``: a forward wait that no record ever releases, and a later host sync that
  waits for its stream (device, stream or read sync): the host waits forever.
* ``deadlock``: waits that wait for each other: a record the host issues only after a sync
  that waits for the held stream, or two ExternalEvents each recorded behind the other's wait.
"""
from __future__ import annotations


from ..hazard import Hazard
from ..trace import EventRecord, EventReset, EventWait, HostSync, Kernel, Trace
from . import describe
from .happens_before import TASKS, memo


def _forward_waits(trace) -> dict:
    """``{wait position: record position or None}`` of the external waits issued before a record."""
    external = {eid for eid, info in trace.events.items() if info.external}
    if not external:
        return {}
    recorded: set = set()
    pending: dict = {}      # eid -> [wait positions waiting for its next record]
    found: dict = {}
    for pos, rec in enumerate(trace.records):
        cls = type(rec)
        if cls is EventRecord and rec.event in external:
            recorded.add(rec.event)
            for w in pending.pop(rec.event, ()):
                found[w] = pos
        elif cls is EventWait and rec.event in external and rec.event not in recorded:
            pending.setdefault(rec.event, []).append(pos)
            found[pos] = None
        elif cls is EventReset:
            recorded.discard(rec.event)
    return found


def _graph(trace, bound: dict):
    """The must-precede graph over record positions: stream FIFO order, host issue order, host
    syncs after what they wait for, and each forward wait after its record."""
    import networkx as nx

    g = nx.DiGraph()
    records = trace.records
    g.add_nodes_from(range(len(records)))
    last_task: dict = {}        # sid -> position of its latest task
    last_record: dict = {}      # eid -> position of its latest record
    host = None                 # position of the latest host record
    device_of = {sid: info.device for sid, info in trace.streams.items()}
    for pos, rec in enumerate(records):
        if type(rec) in TASKS:
            prev = last_task.get(rec.stream)
            if prev is not None:
                g.add_edge(prev, pos)
            if host is not None:
                g.add_edge(host, pos)       # issued by the host after its earlier actions
            last_task[rec.stream] = pos
            if type(rec) is EventRecord:
                last_record[rec.event] = pos
            elif type(rec) is EventWait and pos not in bound and rec.event in last_record:
                g.add_edge(last_record[rec.event], pos)     # an ordinary wait: after the latest record
            continue
        if host is not None:
            g.add_edge(host, pos)
        host = pos
        if type(rec) is HostSync:
            for before in _waited_for(rec, last_task, last_record, device_of):
                g.add_edge(before, pos)
    for wait, record in bound.items():
        if record is not None:
            g.add_edge(record, wait)
    return g


def _waited_for(sync, last_task: dict, last_record: dict, device_of: dict) -> list:
    """Positions a host sync waits for (the latest task of each stream it covers)."""
    if sync.what == "event":
        record = last_record.get(sync.event)
        return [] if record is None else [record]
    if sync.what in ("stream", "read") and sync.stream is not None:
        task = last_task.get(sync.stream)
        return [] if task is None else [task]
    if sync.what in ("device", "stream", "read"):
        return [p for sid, p in last_task.items() if device_of.get(sid, sync.device) == sync.device]
    return []


class _Order:
    """The effective order of a trace (or its cycle, when the waits can never all end)."""

    def __init__(self, trace) -> None:
        self.trace, self.cycle = trace, None
        self.forward = _forward_waits(trace)
        if not any(r is not None for r in self.forward.values()):
            return
        import networkx as nx

        graph = _graph(trace, self.forward)
        try:
            order = list(nx.lexicographical_topological_sort(graph))
        except nx.NetworkXUnfeasible:
            self.cycle = [u for u, _ in nx.find_cycle(graph)]
            return
        if order != sorted(order):
            self.trace = trace.with_records([trace.records[p] for p in order])


def _order(trace, cache) -> _Order:
    return memo(cache, "external_waits", trace, _Order)


def effective(trace, cache: dict | None = None) -> Trace:
    """``trace`` with every ExternalEvent wait after the record it waits for (``trace`` itself when
    no wait comes first, or when the waits deadlock: ``find`` reports that)."""
    return _order(trace, cache).trace


def find(trace, cache: dict | None = None) -> list:
    order = _order(trace, cache)
    found = []
    if order.cycle is not None:
        found.append(_deadlock(trace, order.cycle))
    records = trace.records
    for wait, record in order.forward.items():
        if record is not None:
            continue
        w = records[wait]
        sync = next((r for r in records[wait + 1:] if type(r) is HostSync and _covers(trace, r, w.stream)), None)
        if sync is not None:
            found.append(_never_recorded(trace, w, sync))
    return found


def _covers(trace, sync, sid) -> bool:
    if sync.what in ("stream", "read") and sync.stream is not None:
        return sync.stream == sid
    info = trace.streams.get(sid)
    return sync.what in ("device", "stream", "read") and (info is None or info.device == sync.device)


def _event(trace, eid) -> str:
    info = trace.events.get(eid)
    return f"{info.label} (created at {info.site})" if info is not None and describe.known(info) else f"event #{eid}"


def _never_recorded(trace, wait, sync) -> Hazard:
    stream = describe.stream(trace, wait.stream)
    return Hazard(
        "event-misuse",
        f"event-misuse: {stream} waits at {describe.site(wait)} on an ExternalEvent that is never recorded "
        f"({_event(trace, wait.event)}): the wait holds {stream} forever, so the {sync.what} synchronize at "
        f"{describe.site(sync)} waits for it forever (a hang on hardware). Fix: record the event "
        f"(`event.record(stream)`) after the work to wait for and before line {describe.site(sync)}, "
        f"or remove the wait.",
        [describe.site(r) for r in (wait, sync) if describe.known(r)], [stream], [],
        (wait.seq, sync.seq))


def _step(trace, rec) -> str:
    where = describe.site(rec)
    if type(rec) is EventWait:
        return f"{describe.stream(trace, rec.stream)} waits for {_event(trace, rec.event)} at {where}"
    if type(rec) is EventRecord:
        return f"{describe.stream(trace, rec.stream)} records {_event(trace, rec.event)} at {where}"
    if type(rec) is HostSync:
        return f"the host synchronizes at {where}"
    if type(rec) is Kernel:
        return f"{describe.stream(trace, rec.stream)} runs {rec.op} at {where}"
    return f"the host issues the next call after line {where}"


def _place(trace, pos: int) -> tuple:
    """Sort key of a record position: its stream (or the host of its device), then issue order."""
    rec = trace.records[pos]
    sid = getattr(rec, "stream", None)
    return (*describe.stream_key(trace, sid), pos) if sid is not None else (getattr(rec, "device", -1), "", pos)


def _deadlock(trace, cycle: list) -> Hazard:
    records = [trace.records[p] for p in describe.rotated(cycle, lambda p: _place(trace, p))]
    steps = [r for r in records if type(r) in (EventWait, EventRecord, HostSync)]
    streams = sorted({r.stream for r in steps if type(r) is not HostSync}, key=lambda s: describe.stream_key(trace, s))
    return Hazard(
        "deadlock",
        "deadlock: ExternalEvent waits that can never end, each waiting for the next: "
        + "; then ".join(_step(trace, r) for r in steps)
        + ". A wait issued before its record holds its stream until the record runs, and here the record "
          "comes only after that stream's own work (or after a host sync waiting for it). Fix: issue each "
          "record before anything that waits for the waiting stream, or wait on the record's stream only "
          "after it is issued.",
        [describe.site(r) for r in steps if describe.known(r)], [describe.stream(trace, s) for s in streams],
        [], tuple(r.seq for r in steps))
