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
unordered with ``x`` iff any is.  That newest access is the one reported.  (More precisely a
stream keeps its newest access per key, site and block, so that every pair of lines is reported;
``x`` walks each other stream's keys newest first and stops at the first it is ordered after.)

Skipping checks: once every other stream's accesses of a segment are ordered before an access
of stream ``s``, they are ordered before every later access of ``s`` too (a stream's clock only
grows), so the segment remembers ``s`` and skips the walk until another stream touches it.

Bounded history: every later task starts from the host clock, so an access the host clock already
orders after can never race again; such entries are dropped every ``PRUNE_EVERY`` records (a walk
would stop at them anyway).  An entry is one int, ``seq << SHIFT | index of the span``, and a dense
span's key one int too: an access allocates no object the garbage collector has to trace.

A freed block's history is kept (``Alloc.reuses`` does not reset it; only the pruning above
drops entries): a use of the old tensor still pending when the memory's new owner touches it
is a conflict.  Such a pair is classified ``missing-record-stream`` when the old use ran on
a stream other than the old block's allocation stream without ``record_stream`` to it
(``record_stream`` module reports it); when it had ``record_stream``, the allocator keeps the
address until that use is done, so there is no hazard; otherwise (also for graph-pool memory)
it is a plain race.

A race between another stream's earlier read and a later write by an in-place op that TorchAir's
reinplace-inplaceable-ops pass made out of a functional op on an intermediate tensor (a
``Reinplace`` marker with verdict "applied", matched by graph, line and op) is classified
``reinplace-conflict`` (the ``reinplace`` module reports it): the compiler moved that write onto
memory the other stream still reads (the old value).  A read issued *after* the reinplaced write
consumes the value it produced: the functional graph has the same unordered producer and consumer,
so that pair stays a ``race`` (one root cause, one report).  Writes of the input-mutated pass stay races: mutating the graph
input was the user's own doing.

Reports are deduplicated per (kind, blocks, {(stream, site)} of both sides): a weight read
20,000 times and then written once without synchronisation is one report.  The kind is part of it:
the same two lines can race on a block's old use and miss a ``record_stream`` on another.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ..hazard import Hazard
from ..trace import UNKNOWN_SITE, EventRecord, EventWait, Kernel, Reinplace, Span
from . import contents, describe, happens_before


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two unordered conflicting accesses; ``earlier`` was issued first."""

    earlier: Kernel
    earlier_span: Span
    earlier_writes: bool
    later: Kernel
    later_span: Span
    later_writes: bool
    kind: str                 # "race", "missing-record-stream" or "reinplace-conflict"
    freed: object = None      # the Free of earlier_span.block when the memory was reused

    @property
    def overlap(self) -> tuple:
        return (max(self.earlier_span.lo, self.later_span.lo), min(self.earlier_span.hi, self.later_span.hi))


class _Segment:
    """``reads``/``writes``: ``{stream: {access key: seq << SHIFT | span index}}``, each inner dict
    in ``seq`` order (an update moves its key to the end)."""

    __slots__ = ("lo", "hi", "reads", "writes", "keys", "wok", "aok")

    def __init__(self, lo, hi, reads, writes, wok=-1, aok=-1):
        self.lo, self.hi, self.reads, self.writes = lo, hi, reads, writes
        self.keys = []  # Shadow cover-cache keys listing this segment
        # the stream (dense index) whose clock already orders every other stream's writes (``wok``),
        # or reads and writes (``aok``), after it; -1: none.  See "Skipping checks" in the module doc.
        self.wok, self.aok = wok, aok


class _Line:
    """One device's segments in address order, as short sorted runs: an insert moves a few
    hundred entries instead of every segment after it (a flat list made the pass quadratic)."""

    RUN = 256

    def __init__(self) -> None:
        self.heads: list = []   # first start of each run
        self.starts: list = []  # per run: sorted segment starts
        self.segs: list = []    # per run: the segments

    def find(self, pos):
        """The segment containing ``pos``, else the first one after it, else None."""
        if not self.heads:
            return None
        r = max(bisect_right(self.heads, pos) - 1, 0)
        starts, segs = self.starts[r], self.segs[r]
        i = bisect_right(starts, pos) - 1
        if i >= 0 and segs[i].hi > pos:
            return segs[i]
        if i + 1 < len(segs):
            return segs[i + 1]
        return self.segs[r + 1][0] if r + 1 < len(self.heads) else None

    def insert(self, seg) -> None:
        if not self.heads:
            self.heads.append(seg.lo)
            self.starts.append([seg.lo])
            self.segs.append([seg])
            return
        r = max(bisect_right(self.heads, seg.lo) - 1, 0)
        starts, segs = self.starts[r], self.segs[r]
        i = bisect_right(starts, seg.lo)
        starts.insert(i, seg.lo)
        segs.insert(i, seg)
        self.heads[r] = starts[0]
        if len(starts) > 2 * self.RUN:
            self.heads.insert(r + 1, starts[self.RUN])
            self.starts.insert(r + 1, starts[self.RUN:])
            self.segs.insert(r + 1, segs[self.RUN:])
            del starts[self.RUN:], segs[self.RUN:]

    def split(self, seg, at):
        """Cut ``seg`` at ``at``; both halves keep its history. Returns the right half."""
        right = _Segment(at, seg.hi, {t: dict(d) for t, d in seg.reads.items()},
                         {t: dict(d) for t, d in seg.writes.items()}, seg.wok, seg.aok)
        seg.hi = at
        self.insert(right)
        return right


class Shadow:
    """Disjoint byte segments per device, each with per-stream last read/write entries.

    ``covers`` caches, per ``(device, lo, hi)``, the segments of that range; cutting a
    segment drops the cached ranges that list it.  The hot loop reads ``covers`` directly and
    calls ``cover`` only on a miss.
    """

    def __init__(self) -> None:
        self._lines: dict = {}  # device -> _Line
        self.covers: dict = {}  # (device, lo, hi) -> tuple of segments
        self.live: list = []    # (entries dict, stream) that may hold entries, for ``prune``

    def cover(self, span: Span) -> tuple:
        """The segments making up ``span``'s bytes, cutting and creating them as needed."""
        key = (span.device, span.lo, span.hi)
        segs = self.covers.get(key)
        if segs is None:
            line = self._lines.get(span.device)
            if line is None:
                line = self._lines[span.device] = _Line()
            segs = self.covers[key] = tuple(self._refine(line, span.lo, span.hi))
            for seg in segs:
                seg.keys.append(key)
        return segs

    def _split(self, line: _Line, seg, at):
        for key in seg.keys:
            self.covers.pop(key, None)
        seg.keys = []
        right = line.split(seg, at)
        self.live.extend((d, t) for hist in (right.reads, right.writes) for t, d in hist.items() if d)
        return right

    def prune(self, limits: list) -> None:
        """Drop the entries every later access is ordered after: those of stream ``t`` below
        ``limits[t]`` (``(host[t] + 1) << SHIFT``: every later task starts from the host clock).
        A walk breaks at the first of them anyway, so dropping them changes no result.  Empty
        dicts stay in place: the order of streams in a segment's history is the order conflicts
        are found in."""
        live = []
        for entries, t in self.live:
            limit = limits[t]
            if next(iter(entries.values())) >= limit:    # the oldest is live
                live.append((entries, t))
            elif next(reversed(entries.values())) < limit:   # so is the newest: all dead
                entries.clear()
            else:
                dead = []
                for k, entry in entries.items():    # oldest first
                    if entry >= limit:
                        break
                    dead.append(k)
                for k in dead:
                    del entries[k]
                live.append((entries, t))
        self.live = live

    def _refine(self, line: _Line, lo: int, hi: int) -> list:
        out, pos = [], lo
        while pos < hi:
            seg = line.find(pos)
            if seg is not None and seg.lo <= pos:
                if seg.lo < pos:
                    seg = self._split(line, seg, pos)
                if seg.hi > hi:
                    self._split(line, seg, hi)
            else:
                seg = _Segment(pos, hi if seg is None else min(hi, seg.lo), {}, {})
                line.insert(seg)
            out.append(seg)
            pos = seg.hi
        return out


def conflicts(trace, cache: dict | None = None) -> list:
    """Every unordered conflicting pair, deduplicated (see module doc); memoized in ``cache``.
    Empty when fewer than two streams run kernels (contents.py)."""
    if contents.of(trace, cache).no_conflicts:
        return []
    return happens_before.memo(cache, "races.conflicts", trace,
                               lambda t: _scan(t, happens_before.of(t, cache)))


def reinplaced(trace) -> dict:
    """(graph name, site, in-place op) -> the ``Reinplace`` marker of each intermediate tensor
    TorchAir's reinplace pass updates in place."""
    return {(rec.verdict.graph, rec.site, rec.verdict.inplace_op): rec for rec in trace.records
            if type(rec) is Reinplace and rec.verdict.pass_name == "inplaceable"
            and rec.verdict.verdict == "applied"}


def reinplace_of(reinplaced: dict, kernel: Kernel):
    """The reinplace marker behind ``kernel`` (a replayed in-place op TorchAir made), else None."""
    if not reinplaced or kernel.graph is None:
        return None
    return reinplaced.get((kernel.graph.name, kernel.site, kernel.op))


PRUNE_EVERY = 16384    # records between two prunes at least
SHIFT = 32            # an entry is ``seq << SHIFT | i``: access ``i`` of the kernel's reads or writes
MASK = (1 << SHIFT) - 1


def _scan(trace, hb) -> list:
    shadow = Shadow()
    reinplaced_ops = reinplaced(trace)
    cover, covers, live = shadow.cover, shadow.covers, shadow.live
    host = None         # position of the latest host record (its clock is the host's)
    next_prune = PRUNE_EVERY
    index, clocks, blocks = hb.index, hb.clocks, trace.blocks
    records, position = trace.records, hb.position
    facts = hb.memory
    freed, recorded = facts.free, facts.recorded
    found: dict = {}
    site_ids: dict = {}     # (path, line, func) -> number
    ge = {sid for sid in trace.streams if describe.ge_stream(trace, sid)}
    ge_planned = ge.__contains__

    def conflict(entry, earlier_writes, x, span, later_writes):
        a = records[position(entry >> SHIFT)]
        aspan = (a.writes if earlier_writes else a.reads)[entry & MASK]
        if (aspan.dims or span.dims) and not aspan.overlaps(span):
            return      # strided views whose bounding ranges meet but whose elements do not
        old, kind, free = aspan.block, "race", None
        if old != span.block and facts.freed_before(old, pos):
            free = freed[old]
            info = blocks.get(old)
            if ge_planned(a.stream):
                return  # GE planned this memory statically: its reuse waits for every stream's use
            if info is not None and info.pool is None and info.stream != a.stream:
                if a.stream in recorded.get(old, ()):
                    return  # the allocator held the address until this use was done
                kind = "missing-record-stream"
        if kind == "race" and later_writes and not earlier_writes and reinplace_of(reinplaced_ops, x):
            kind = "reinplace-conflict"     # the reinplaced write against a read the functional op did not race
        key = (kind, frozenset((old, span.block)), frozenset(((a.stream, a.site), (x.stream, x.site))))
        if key not in found:
            found[key] = Conflict(a, aspan, earlier_writes, x, span, later_writes, kind, free)

    def against(history, c, s, x, span, earlier_writes, later_writes):
        """Check ``x`` against every other stream's unordered accesses of one segment: newest
        first, stopping at the first one ``x`` is ordered after (all older ones are too).
        True iff there was none (every other stream's accesses are ordered before ``x``)."""
        clean = True
        for t, entries in history.items():
            if t != s:
                known = (c[t] + 1) << SHIFT     # entries below it are ordered before x
                for entry in reversed(entries.values()):
                    if entry < known:
                        break
                    clean = False
                    conflict(entry, earlier_writes, x, span, later_writes)
        return clean

    for pos, rec in enumerate(trace.records):
        cls = type(rec)
        if cls is not Kernel:
            if cls is not EventRecord and cls is not EventWait:
                host = pos
            continue
        if pos >= next_prune and host is not None:
            limits = [(known + 1) << SHIFT for known in clocks[host]]
            shadow.prune(limits + [0] * (len(hb.sids) - len(limits)))
            live = shadow.live
            next_prune = pos + max(PRUNE_EVERY, len(live))     # a prune costs about len(live)
        if not (rec.writes or rec.reads):
            continue
        s = index[rec.stream]
        c = clocks[pos]
        base = rec.seq << SHIFT
        # each access is kept as the newest of its key on its stream (see module doc).  The key is the
        # site's number (by its fields: a dataclass hash is a Python call) and the block, one int for a
        # dense span; a strided one adds its layout.  Equal keys iff equal (site, block, span.dims and span).
        # The write and read loops below repeat that bookkeeping inline on purpose: it runs per (access,
        # segment), and a function call there was a third of the scan.
        site = rec.site
        where = (site.path, site.line, site.func)
        sk = site_ids.get(where)
        if sk is None:
            sk = site_ids[where] = len(site_ids)
        for i, span in enumerate(rec.writes):
            entry = base | i
            dims = span.dims
            key = (sk, span.block, span.lo, span.hi, span.run, dims) if dims else span.block << SHIFT | sk
            for seg in covers.get((span.device, span.lo, span.hi)) or cover(span):
                writes = seg.writes
                if seg.aok != s:
                    # only other streams' accesses can race
                    clean = seg.wok == s or not (len(writes) > 1 or (writes and s not in writes)) \
                        or against(writes, c, s, rec, span, True, True)
                    seg.wok = s if clean else -1
                    reads = seg.reads
                    if len(reads) > 1 or (reads and s not in reads):
                        clean = against(reads, c, s, rec, span, False, True) and clean
                    seg.aok = s if clean else -1
                entries = writes.get(s)
                if not entries:
                    if entries is None:
                        entries = writes[s] = {}
                    live.append((entries, s))
                entries.pop(key, None)
                entries[key] = entry
        written = None
        for i, span in enumerate(rec.reads):
            entry = base | i
            dims = span.dims
            key = (sk, span.block, span.lo, span.hi, span.run, dims) if dims else span.block << SHIFT | sk
            for seg in covers.get((span.device, span.lo, span.hi)) or cover(span):
                if seg.wok != s:
                    writes = seg.writes
                    if len(writes) > 1 or (writes and s not in writes):
                        if written is None:
                            written = {(w.lo, w.hi, w.block, w.run, w.dims) for w in rec.writes}
                        # a span this kernel also writes was checked as a write
                        if (span.lo, span.hi, span.block, span.run, span.dims) not in written:
                            seg.wok = s if against(writes, c, s, rec, span, True, False) else -1
                    else:
                        seg.wok = s
                if seg.aok != s:
                    seg.aok = -1
                reads = seg.reads
                entries = reads.get(s)
                if not entries:
                    if entries is None:
                        entries = reads[s] = {}
                    live.append((entries, s))
                entries.pop(key, None)
                entries[key] = entry
    return list(found.values())


def find(trace, cache: dict | None = None) -> list:
    """Kind ``race``: one hazard per pair of (stream, source line) racing, naming every tensor the two
    lines race on."""
    groups: dict = {}
    for c in conflicts(trace, cache):
        if c.kind == "race":
            sides = frozenset(((c.earlier.stream, c.earlier.site), (c.later.stream, c.later.site)))
            groups.setdefault(sides, []).append(c)
    return [_hazard(trace, cs) for cs in groups.values()]


def memory(trace, c: Conflict) -> str:
    """What the two accesses share, naming both tensors when the memory changed owner."""
    lo, hi = c.overlap
    old, new = c.earlier_span.block, c.later_span.block
    strided = bool(c.earlier_span.dims or c.later_span.dims)
    if old == new:
        return describe.tensor(trace, old) + describe.overlap(trace, old, lo, hi, strided)
    freed = f", freed at {describe.site(c.freed)}," if c.freed is not None and describe.known(c.freed) else ""
    return (f"memory that changed owner: {describe.tensor(trace, old)}{freed} and then "
            f"{describe.tensor(trace, new)}{describe.overlap(trace, new, lo, hi, strided)}")


def _memories(trace, cs: list) -> str:
    """Every tensor the two lines race on, in full; memory that changed owner in full once, its other
    owners by allocation line (a loop reusing one block gave a clause per reuse), so one report stays
    one screen."""
    full, reused, seen, changed = [], [], set(), False
    for o in cs:
        text = memory(trace, o)
        if text in seen:
            continue
        seen.add(text)
        if o.earlier_span.block != o.later_span.block:
            if changed:
                info = trace.blocks.get(o.later_span.block)
                reused.append(str(info.site) if info is not None and info.site != UNKNOWN_SITE
                              else f"block #{o.later_span.block}")
                continue
            changed = True
        full.append(text)
    what = " and on ".join(full)
    if reused:
        what += (f" (and on {len(reused)} more tensor(s) that took that memory over, allocated at "
                 f"{', '.join(dict.fromkeys(reused))})")
    return what


def _hazard(trace, cs: list) -> Hazard:
    c = cs[0]
    a, x = c.earlier, c.later
    doing = "writing" if c.earlier_writes else "reading"
    what = _memories(trace, cs)
    message = (
        f"race on {what}: {describe.access(trace, x, c.later_writes)}, while "
        f"{describe.stream(trace, a.stream)} may still be {doing} it in {a.op} at {describe.site(a)}; "
        f"nothing orders the two (no event record/wait, wait_stream or synchronize in between). "
        f"Fix: {describe.order_fix(trace, a, x)}.")
    return Hazard("race", message, [describe.site(a), describe.site(x)],
                  [describe.stream(trace, a.stream), describe.stream(trace, x.stream)], [a.op, x.op], (a.seq, x.seq))
