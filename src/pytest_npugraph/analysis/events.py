"""Event misuse (kind ``event-misuse``): synchronisation calls that cannot do what they say.

Sub-rules, each silent on correct code:

(a) never recorded: an ``EventWait`` (``stream.wait_event`` / ``event.wait``) or a host
    ``event.synchronize()`` on an event with no earlier ``EventRecord``.  Both are no-ops on
    hardware (``NPUEvent::block``/``synchronize`` return at once for an event not yet created),
    so whatever the user meant to order is not; the call itself harms nothing, so this is a
    warning, and the race detector reports the accesses it fails to order.  ``ExternalEvent``
    is exempt: its wait may legitimately precede the record (external_waits.py: it waits for
    that record, and reports as an error the one never recorded, which hangs the device).
(b) side stream not joined before capture ends: between ``CaptureBegin`` and
    ``CaptureEnd`` on stream S, every other stream of S's device that got work must have
    that work ordered before S's last task of the capture (S waited for it); otherwise
    the graph ends with unjoined work (CUDA's "capture unjoined" error; torchair joins its own
    scopes, so this is user streams/events).
(c) cross-device record: an event recorded on a stream of another device than its earlier
    records (an event belongs to the device of its first record).
(d) ``ExternalEvent`` waited twice for one record (counted from its latest record or
    ``reset()``, ``EventReset``): the runtime rejects a second wait
    ("A single record operation cannot be associated with multiple wait operations").
(e) tag reused: two tagged events with the same tag (tags are process-unique in torchair).

One report per (sub-rule, event or stream, call site).
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import CaptureBegin, CaptureEnd, EventRecord, EventReset, EventWait, HostSync, Kernel
from . import describe, happens_before

KIND = "event-misuse"


def find(trace, cache: dict | None = None) -> list:
    found: dict = {}
    hb = None
    record_device: dict = {}   # eid -> device of its first record
    waits: dict = {}           # eid -> waits since its latest record
    captures: dict = {}        # capture stream sid -> _Capture
    for rec in trace.records:
        cls = type(rec)
        if cls is Kernel or cls is EventRecord or cls is EventWait:
            if captures:
                _note_work(trace, captures, rec)
            if cls is EventRecord:
                _check_device(trace, found, record_device, rec)
                waits[rec.event] = 0
            elif cls is EventWait:
                if rec.event not in record_device:
                    _never_recorded(trace, found, rec, "waits")
                elif _external(trace, rec.event):
                    waits[rec.event] = waits.get(rec.event, 0) + 1
                    if waits[rec.event] == 2:
                        _twice(trace, found, rec)
        elif cls is HostSync:
            if rec.what == "event" and rec.event is not None and rec.event not in record_device:
                _never_recorded(trace, found, rec, "synchronizes")
        elif cls is EventReset:
            waits[rec.event] = 0   # the next wait belongs to the next record
        elif cls is CaptureBegin:
            captures[rec.stream] = _Capture(rec)
        elif cls is CaptureEnd and rec.stream in captures:
            hb = hb or happens_before.of(trace, cache)
            _check_join(trace, found, hb, captures.pop(rec.stream), rec)
    _check_tags(trace, found)
    return list(found.values())


def _add(found, key, trace, message, records, streams=(), severity="error") -> None:
    if key not in found:
        where = [describe.site(r) for r in records if describe.known(r)]
        ops = [r.op for r in records if isinstance(r, Kernel)]
        found[key] = Hazard(KIND, message, where, [describe.stream(trace, s) for s in streams], ops,
                            tuple(r.seq for r in records if hasattr(r, "seq")), severity=severity)


def _event(trace, eid) -> str:
    info = trace.events.get(eid)
    if info is None:
        return f"event #{eid}"
    created = f" (created at {info.site})" if describe.known(info) else ""
    return f"{info.label}{created}"


def _external(trace, eid) -> bool:
    info = trace.events.get(eid)
    return info is not None and info.external


# ------------------------------------------------------------------ (a), (c), (d)
def _never_recorded(trace, found, rec, verb) -> None:
    if _external(trace, rec.event):
        return
    who = describe.stream(trace, rec.stream) if verb == "waits" else "the host"
    _add(found, ("never-recorded", rec.event, rec.site), trace,
         f"event-misuse: {who} {verb} at {describe.site(rec)} on {_event(trace, rec.event)}, which was "
         f"never recorded before: the call is a no-op and orders nothing. Fix: record the event "
         f"(`event.record(stream)`) on the producing stream after the work to wait for and before line "
         f"{describe.site(rec)}, or remove the call.",
         [rec], [rec.stream] if verb == "waits" else [], severity="warning")


def _check_device(trace, found, record_device, rec) -> None:
    info = trace.streams.get(rec.stream)
    device = info.device if info is not None else None
    first = record_device.setdefault(rec.event, device)
    if device is not None and first is not None and device != first:
        _add(found, ("cross-device", rec.event, rec.site), trace,
             f"event-misuse: {_event(trace, rec.event)} belongs to npu:{first} (its first record) but "
             f"is recorded at {describe.site(rec)} on {describe.stream(trace, rec.stream)} of npu:{device}. "
             f"Fix: use one event per device (create a new event for npu:{device}).",
             [rec], [rec.stream])


def _twice(trace, found, rec) -> None:
    _add(found, ("external-twice", rec.event, rec.site), trace,
         f"event-misuse: {_event(trace, rec.event)} is an ExternalEvent waited a second time for one "
         f"record at {describe.site(rec)} on {describe.stream(trace, rec.stream)}; torch_npu rejects this "
         f"(\"A single record operation cannot be associated with multiple wait operations\"). "
         f"Fix: record the event again (after `reset()`) before each wait.",
         [rec], [rec.stream])


# ---------------------------------------------------------------------------- (b)
class _Capture:
    __slots__ = ("begin", "own_last", "last")

    def __init__(self, begin):
        self.begin = begin
        self.own_last = None   # the capture stream's latest task in the capture
        self.last: dict = {}   # other sid -> its latest task in the capture


def _note_work(trace, captures, rec) -> None:
    for sid, cap in captures.items():
        if rec.stream == sid:
            cap.own_last = rec
        elif _same_device(trace, rec.stream, sid):
            cap.last[rec.stream] = rec


def _same_device(trace, a, b) -> bool:
    ia, ib = trace.streams.get(a), trace.streams.get(b)
    return ia is None or ib is None or ia.device == ib.device


def _check_join(trace, found, hb, cap, end) -> None:
    own = cap.own_last
    for sid, last in cap.last.items():
        if own is not None and hb.ordered(last.seq, own.seq):
            continue
        side, capture = describe.stream(trace, sid), describe.stream(trace, end.stream)
        ends = f" at {describe.site(end)}" if describe.known(end) else ""
        what = f"{last.op} " if isinstance(last, Kernel) else ""
        _add(found, ("unjoined", end.stream, sid, last.site), trace,
             f"event-misuse: {side} got work during the graph capture on {capture} (last: {what}at "
             f"{describe.site(last)}) but {capture} did not wait for it before the capture ended{ends}: "
             f"a side stream must be joined back before the end of capture. Fix: record an event on "
             f"{side} after line {describe.site(last)} and wait for it on {capture} before the capture "
             f"ends (`torch.npu.current_stream().wait_stream({describe.stream_expr(trace, sid)})` on the capture stream).",
             [last, end], [sid, end.stream])


# ---------------------------------------------------------------------------- (e)
def _check_tags(trace, found) -> None:
    by_tag: dict = {}
    for info in trace.events.values():
        if info.tag is not None:
            by_tag.setdefault(info.tag, []).append(info)
    for tag, infos in by_tag.items():
        if len(infos) > 1:
            sites = ", ".join(str(i.site) for i in infos)
            _add(found, ("tag", tag), trace,
                 f"event-misuse: tag {tag!r} is used by {len(infos)} tagged events (created at {sites}); "
                 f"torchair tags are unique per process (`npu_create_tagged_event` raises on a reused tag). "
                 f"Fix: give each tagged event its own tag.", infos)
