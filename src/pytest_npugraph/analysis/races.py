"""Cross-stream data races (kind ``race``) from a bounded shadow memory.

Rule: two ``Kernel`` accesses to overlapping bytes (``Span.overlaps``: same device,
intersecting ranges, so views and slices count) on different streams, at least one a
write, neither happening before the other (``happens_before``).

Shadow state (FastTrack/TSan style, but by byte range): the address space of each device
is cut into disjoint segments at every access boundary seen so far; a segment keeps, per
stream, its last read and its last write.  That is exact, not an approximation: the
accesses of one stream are ordered among themselves, so the ones a later access ``x`` is
*not* ordered after form a suffix of that stream's history, and the newest conflicting
access (the last write, or for a write ``x`` the newer of last read and last write) is
unordered with ``x`` iff any is.  That newest access is the one reported.

A freed block's history is kept (``Alloc.reuses`` does not reset it): a use of the old
tensor still pending when the memory's new owner touches it is a conflict.  Such a pair is
classified ``missing-record-stream`` when the old use ran on a stream other than the old
block's allocation stream without ``record_stream`` to it (``record_stream`` module reports
it); when it had ``record_stream``, the allocator keeps the address until that use is done,
so there is no hazard; otherwise it is a plain race.

Reports are deduplicated per (blocks, {(stream, site)} of both sides): a weight read
20,000 times and then written once without synchronisation is one report.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ..hazard import Hazard
from ..trace import Free, Kernel, RecordStream, Span
from . import happens_before, report


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two unordered conflicting accesses; ``earlier`` was issued first."""

    earlier: Kernel
    earlier_span: Span
    earlier_writes: bool
    later: Kernel
    later_span: Span
    later_writes: bool
    kind: str                 # "race" or "missing-record-stream"
    freed: object = None      # the Free of earlier_span.block when the memory was reused

    @property
    def overlap(self) -> tuple:
        return (max(self.earlier_span.lo, self.later_span.lo), min(self.earlier_span.hi, self.later_span.hi))


class _Segment:
    __slots__ = ("lo", "hi", "reads", "writes")

    def __init__(self, lo, hi, reads, writes):
        self.lo, self.hi, self.reads, self.writes = lo, hi, reads, writes


class Shadow:
    """Disjoint byte segments per device, each with per-stream last read/write entries."""

    def __init__(self) -> None:
        self._starts: dict = {}  # device -> sorted segment starts
        self._segs: dict = {}    # device -> segments, parallel to _starts
        self._exact: dict = {}   # (device, lo, hi) -> the one segment that is exactly that range

    def cover(self, span: Span):
        """The segments making up ``span``'s bytes, cutting and creating them as needed."""
        key = (span.device, span.lo, span.hi)
        seg = self._exact.get(key)
        if seg is not None and seg.hi == span.hi:  # a split only ever lowers ``hi``
            return (seg,)
        segs = self._refine(span.device, span.lo, span.hi)
        if len(segs) == 1:
            self._exact[key] = segs[0]
        return segs

    def _refine(self, device, lo, hi) -> list:
        starts = self._starts.setdefault(device, [])
        segs = self._segs.setdefault(device, [])
        k = bisect_right(starts, lo) - 1
        if k >= 0 and starts[k] < lo < segs[k].hi:
            self._split(starts, segs, k, lo)
            k += 1
        elif k < 0 or starts[k] != lo:
            k += 1
        out, pos = [], lo
        while pos < hi:
            if k < len(segs) and starts[k] == pos:
                seg = segs[k]
                if seg.hi > hi:
                    self._split(starts, segs, k, hi)
            else:
                end = min(hi, starts[k]) if k < len(segs) else hi
                seg = _Segment(pos, end, {}, {})
                starts.insert(k, pos)
                segs.insert(k, seg)
            out.append(seg)
            pos = seg.hi
            k += 1
        return out

    @staticmethod
    def _split(starts, segs, k, at) -> None:
        seg = segs[k]
        right = _Segment(at, seg.hi, dict(seg.reads), dict(seg.writes))
        seg.hi = at
        starts.insert(k + 1, at)
        segs.insert(k + 1, right)


def conflicts(trace, cache: dict | None = None) -> list:
    """Every unordered conflicting pair, deduplicated (see module doc); memoized in ``cache``."""
    if cache is not None and cache.get("races.trace") is trace and cache.get("races.len") == len(trace.records):
        return cache["races.conflicts"]
    found = _scan(trace, happens_before.of(trace, cache))
    if cache is not None:
        cache.update({"races.trace": trace, "races.len": len(trace.records), "races.conflicts": found})
    return found


def _scan(trace, hb) -> list:
    shadow = Shadow()
    cover = shadow.cover
    index, clocks, blocks = hb.index, hb.clocks, trace.blocks
    freed: dict = {}     # bid -> Free
    recorded: dict = {}  # bid -> sids given to record_stream before the free
    found: dict = {}

    def conflict(entry, earlier_writes, x, span, later_writes):
        _, a, aspan = entry
        old, kind, free = aspan.block, "race", None
        if old != span.block and old in freed:
            free = freed[old]
            info = blocks.get(old)
            if info is not None and info.stream != a.stream:
                if a.stream in recorded.get(old, ()):
                    return  # the allocator held the address until this use was done
                kind = "missing-record-stream"
        key = (frozenset((old, span.block)), frozenset(((a.stream, a.site), (x.stream, x.site))))
        if key not in found:
            found[key] = Conflict(a, aspan, earlier_writes, x, span, later_writes, kind, free)

    for pos, rec in enumerate(trace.records):
        cls = type(rec)
        if cls is Kernel:
            if not (rec.writes or rec.reads):
                continue
            s = index[rec.stream]
            c = clocks[pos]
            for span in rec.writes:
                entry = (rec.seq, rec, span)
                for seg in cover(span):
                    reads, writes = seg.reads, seg.writes
                    for t, w in writes.items():
                        if t != s:
                            r = reads.get(t)
                            if r is not None and r[0] > w[0]:
                                if c[t] < r[0]:
                                    conflict(r, False, rec, span, True)
                            elif c[t] < w[0]:
                                conflict(w, True, rec, span, True)
                    for t, r in reads.items():
                        if t != s and t not in writes and c[t] < r[0]:
                            conflict(r, False, rec, span, True)
                    writes[s] = entry
            for span in rec.reads:
                entry = (rec.seq, rec, span)
                for seg in cover(span):
                    own = seg.writes.get(s) if rec.writes else None
                    if own is None or own[0] != rec.seq:  # else already checked as this kernel's write
                        for t, w in seg.writes.items():
                            if t != s and c[t] < w[0]:
                                conflict(w, True, rec, span, False)
                    seg.reads[s] = entry
        elif cls is Free:
            freed[rec.block] = rec
        elif cls is RecordStream and rec.block not in freed:
            recorded.setdefault(rec.block, set()).add(rec.stream)
    return list(found.values())


def find(trace, cache: dict | None = None) -> list:
    """Kind ``race``: one hazard per deduplicated unordered conflicting pair."""
    return [_hazard(trace, c) for c in conflicts(trace, cache) if c.kind == "race"]


def memory(trace, c: Conflict) -> str:
    """What the two accesses share, naming both tensors when the memory changed owner."""
    lo, hi = c.overlap
    old, new = c.earlier_span.block, c.later_span.block
    if old == new:
        info = trace.blocks.get(old)
        whole = info is not None and (info.lo, info.hi) == (lo, hi)
        return report.tensor(trace, old) + ("" if whole else f", overlapping in bytes [{lo}, {hi})")
    freed = f", freed at {report.site(c.freed)}," if c.freed is not None and report.known(c.freed) else ""
    return (f"memory that changed owner: {report.tensor(trace, old)}{freed} and then "
            f"{report.tensor(trace, new)}, overlapping in bytes [{lo}, {hi})")


def _hazard(trace, c: Conflict) -> Hazard:
    a, x = c.earlier, c.later
    doing = "writing" if c.earlier_writes else "reading"
    message = (
        f"race on {memory(trace, c)}: {report.access(trace, x, c.later_writes)}, while "
        f"{report.stream(trace, a.stream)} may still be {doing} it in {a.op} at {report.site(a)}; "
        f"nothing orders the two (no event record/wait, wait_stream or synchronize in between). "
        f"Fix: {report.order_fix(trace, a, x)}.")
    return Hazard("race", message, [report.site(a), report.site(x)],
                  [report.stream(trace, a.stream), report.stream(trace, x.stream)], [a.op, x.op], (a.seq, x.seq))
