"""The caching allocator's part of a planned run: learned from one run, applied at once on later ones.

Why: a planned run (``planned.Stretch``) mallocs and frees the same sizes on the same streams in the
same order every time.  The caching allocator is deterministic, so from the same free lists it hands
out the same addresses and logs the same statistics changes; only the block ids are new.  Doing ~100
real mallocs and frees per run through the allocator cost more than the graph's math, so one run is
watched (``Watch``) and, when the free lists a later run starts from are the ones the watched run
started from, its effects are applied at once (``AllocSchedule.apply``): each free chunk the watched
run carved is replaced by the pieces it left (free pieces back in the free list, the chunks of the
blocks that outlive the run handed to new Blocks), and its statistics changes are logged as one
array.  Addresses, reuse, statistics and free lists are then exactly those of the real mallocs and
frees (tests/graph/test_ge_plan.py compares them with op-by-op runs).

What the watched run's effects depend on, and so what ``matches`` checks: the free lists of the
(stream, small pool) pairs it allocates from, entry by entry (best fit, and whether a freed chunk
merges with a free neighbour: every non-free chunk is allocated, as no free is pending).  A watched
run is not learned from when it made or released a segment (an out-of-memory retry, ``empty_cache``),
left a free pending, folded the statistics log midway, or when anything else changed the allocator
meanwhile (a finalizer's free shows as an extra trace row).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Optional
from weakref import ref

from .allocator import MIN_BLOCK, SMALL_SIZE, Block, Chunk, Stats


def pool_key(sid: int, nbytes: int) -> tuple:
    """The free list ``malloc(nbytes)`` on stream ``sid`` takes from (the device's own pool)."""
    size = max(MIN_BLOCK, (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK)
    return (sid, size <= SMALL_SIZE, None)


class Watch:
    """The allocator's state before a run that may become a schedule (see the module docstring)."""

    __slots__ = ("allocator", "keys", "start", "segments", "reserved", "folds", "log_len", "rows", "ranges")

    def __init__(self, allocator, keys, rows: int, ranges):
        self.allocator = allocator
        self.ranges = list(ranges or ())    # the runtime's freed ranges of the device (``Runtime._reused``)
        self.keys = keys                # the free lists the run will take from (None: not known, all)
        free = allocator.free_chunks
        self.start = {key: [(s, lo) for s, lo, _ in free.get(key, ())] for key in (free if keys is None else keys)}
        self.segments = len(allocator.segments)
        self.reserved = allocator.reserved
        self.folds = allocator.stats.folds
        self.log_len = len(allocator.stats.log)
        self.rows = rows

    @classmethod
    def start_if_possible(cls, allocator, keys, rows: int, ranges) -> Optional["Watch"]:
        if allocator.pending or allocator._deferred:
            return None
        return cls(allocator, keys, rows, ranges)

    def finish(self, slots: list, streams: list, requested: list, rows: int, order: list, reuses: list,
               ranges) -> Optional["AllocSchedule"]:
        """The schedule of the run just made, or None.  ``slots``: ``(bid, lo, size, freed)`` of the run's
        blocks in allocation order (``streams``/``requested``: their streams and sizes as asked);
        ``rows``: the trace's length now (the run appended one row per task if nothing else happened);
        ``order``: ``(malloc?, slot)`` of its mallocs and frees in order; ``reuses``: each block's
        ``Alloc.reuses``; ``ranges``: the freed ranges now."""
        a = self.allocator
        if (a.pending or a._deferred or len(a.segments) != self.segments or a.reserved != self.reserved
                or a.stats.folds != self.folds or rows != self.rows):
            return None
        stats = a.stats.log[self.log_len:]
        codes = stats[::3]
        malloced, released = Stats.CODES["malloced"], Stats.CODES["released"]
        if (sum(1 for c in codes if c >> 1 == malloced) != len(slots)
                or sum(1 for c in codes if c >> 1 == released) != sum(1 for slot in slots if slot[3])):
            return None         # the allocator did more than this run's mallocs and frees
        keys = {pool_key(sid, n) for sid, n in zip(streams, requested)}
        start = {key: self.start.get(key, []) for key in keys}
        if self.keys is None and any(key not in keys and [(s, lo) for s, lo, _ in a.free_chunks.get(key, ())] !=
                                     entries for key, entries in self.start.items()):
            return None
        # the start free chunks, by address, and the ones each block was carved from
        starts = sorted((lo, lo + size, key, i) for key, entries in start.items()
                        for i, (size, lo) in enumerate(entries))
        los = [s[0] for s in starts]
        carved: dict = {}
        for k, (bid, lo, size, freed) in enumerate(slots):
            i = bisect_right(los, lo) - 1
            if i < 0 or lo + size > starts[i][1] or starts[i][2] != pool_key(streams[k], requested[k]):
                return None
            carved.setdefault(i, []).append(k)
        slot_of = {slot[0]: k for k, slot in enumerate(slots)}
        patches = []
        for i in sorted(carved):
            lo, hi, key, index = starts[i]
            seg = next((s for s in a.segments if s.lo <= lo < s.lo + s.size), None)
            if seg is None:
                return None
            chunk = seg.first
            while chunk is not None and chunk.lo < lo:
                chunk = chunk.next
            pieces = []
            while chunk is not None and chunk.lo < hi:
                if chunk.pending:
                    return None
                if chunk.allocated:
                    owner = chunk.owner
                    k = None if owner is None else slot_of.get(owner.bid)
                    if k is None or owner.freed or slots[k][3]:
                        return None
                    pieces.append((k, chunk.lo, chunk.size))
                else:
                    pieces.append((None, chunk.lo, chunk.size))
                chunk = chunk.next
            if not pieces or pieces[0][1] != lo or sum(p[2] for p in pieces) != hi - lo:
                return None
            if pieces != [(None, lo, hi - lo)]:        # else the run left that chunk as it found it
                patches.append((key, index, tuple(pieces)))
        # the free lists the run left must be what the patches make of the start ones
        for key, entries in start.items():
            dropped = {index for k, index, _ in patches if k == key}
            expected = sorted([e for i, e in enumerate(entries) if i not in dropped] +
                              [(size, lo) for k, index, pieces in patches if k == key
                               for slot, lo, size in pieces if slot is None])
            if [(s, lo) for s, lo, _ in a.free_chunks.get(key, ())] != expected:
                return None
        live = {k for _, _, pieces in patches for k, _, _ in pieces if k is not None}
        if any(not slots[k][3] for k in range(len(slots)) if k not in live):
            return None
        spans = [(lo, lo + size) for _, lo, size, _ in slots]
        reuse = _reuse_schedule([(starts[i][0], starts[i][1]) for i in sorted(carved)], self.ranges, order, spans,
                                [slot[0] for slot in slots], reuses, ranges)
        if reuse is None:
            return None
        return AllocSchedule(a, start, patches, stats, spans, streams, requested, *reuse)


def _reuse_schedule(regions: list, start: list, order: list, spans: list, bids: list, reuses: list, end):
    """How a run's blocks reuse freed ranges (``Runtime._reused``: the newest freed block an allocation
    overlaps; a free adds its range), replayed on the ranges the run started from with each range's
    origin as its tag: ``(0, region, i)`` the region's i-th range at the start, ``(1, slot)`` a block
    of the run (their ids order them as the tags do).  Returns ``(checks, ends, sources)``: per carved
    region its ``(lo, hi)`` and the ``(lo, hi)`` of its ranges at the start, per region its ranges at
    the end, per block the tags it reuses; or None when the replay disagrees with what the run did."""
    checks, sim, start_bids = [], [], {}
    for n, (lo, hi) in enumerate(regions):
        i, j = bisect_left(start, (lo,)), bisect_left(start, (hi,))
        if i and start[i - 1][1] > lo:
            return None         # a freed range straddles the region: not one the allocator left free
        inside = start[i:j]
        if any(r[1] > hi for r in inside):
            return None
        checks.append((lo, hi, tuple((r[0], r[1]) for r in inside)))
        for m, r in enumerate(inside):
            sim.append((r[0], r[1], (0, n, m)))
            start_bids[(0, n, m)] = r[2]
    sim.sort()
    outside = [r for r in start if not any(lo <= r[0] < hi for lo, hi in regions)]

    def bid_of(tag):
        return start_bids[tag] if tag[0] == 0 else bids[tag[1]]

    sources = [()] * len(spans)
    for malloc, k in order:
        lo, hi = spans[k]
        if not malloc:
            insort(sim, (lo, hi, (1, k)))
            continue
        i = bisect_left(sim, (lo,))
        if i and sim[i - 1][1] > lo:
            i -= 1
        j = bisect_left(sim, (hi,), i, min(i + 64, len(sim)))
        hits = sim[i:j]
        del sim[i:j]
        sources[k] = tuple(h[2] for h in hits)
        if (max(bid_of(t) for t in sources[k]) if hits else None) != reuses[k]:
            return None
    ends = [tuple(r for r in sim if lo <= r[0] < hi) for lo, hi in regions]
    if sorted(outside + [(r[0], r[1], bid_of(r[2])) for r in sim]) != list(end or ()):
        return None
    return checks, ends, sources


class AllocSchedule:
    """A watched run's effects on the allocator (see the module docstring).  ``spans``: each slot's
    ``(lo, hi)``, the same on every run it applies to."""

    __slots__ = ("allocator", "start", "patches", "stats", "spans", "streams", "requested", "checks", "ends",
                 "sources")

    def __init__(self, allocator, start: dict, patches: list, stats, spans: list, streams: list, requested: list,
                 checks: list, ends: list, sources: list):
        self.checks = checks              # per carved region: (lo, hi, the (lo, hi) of its freed ranges)
        self.ends = ends                  # per carved region: its freed ranges after the run, as tags
        self.sources = sources            # per block: the tags of the freed ranges it reuses
        self.allocator = allocator
        self.start = list(start.items())
        self.patches = patches            # (free list key, index in it, ((slot or None, lo, size), ...))
        self.stats = stats                # the statistics log entries of the run (an array)
        self.spans = spans
        self.streams = streams
        self.requested = requested

    def matches(self) -> bool:
        """Whether the allocator's free lists are those the watched run started from (call with the
        allocator busy: ``apply``'s caller holds it so, so that no finalizer's free changes them)."""
        a = self.allocator
        if a.pending:
            return False
        free = a.free_chunks
        for key, expected in self.start:
            entries = free.get(key)
            if entries is None:
                if expected:
                    return False
                continue
            if len(entries) != len(expected):
                return False
            for (size, lo, _), (s, l) in zip(entries, expected):
                if size != s or lo != l:
                    return False
        return True

    def ranges_match(self, ranges) -> Optional[list]:
        """The block ids of each carved region's freed ranges if they lie as in the watched run, else None."""
        ranges = ranges or ()
        found = []
        for lo, hi, expected in self.checks:
            i = bisect_left(ranges, (lo,))
            if i and ranges[i - 1][1] > lo:
                return None
            j = i + len(expected)
            inside = ranges[i:j]
            if j < len(ranges) and ranges[j][0] < hi:
                return None
            for (a, b, _), (c, d) in zip(inside, expected):
                if a != c or b != d:
                    return None
            if len(inside) != len(expected):
                return None
            found.append([r[2] for r in inside])
        return found

    def update_ranges(self, rt, device: int, found: list, bids: list) -> None:
        """Set the freed ranges of the carved regions to what the run leaves (``found``: what
        ``ranges_match`` returned; ``bids``: the run's block ids)."""
        ranges = rt.freed_ranges.get(device)
        if ranges is None:
            ranges = rt.freed_ranges[device] = []
        for (lo, _, expected), end in zip(reversed(self.checks), reversed(self.ends)):
            i = bisect_left(ranges, (lo,))
            ranges[i:i + len(expected)] = [(a, b, found[t[1]][t[2]] if t[0] == 0 else bids[t[1]]) for a, b, t in end]

    def apply(self, bids: list) -> dict:
        """The run's effects, its blocks numbered ``bids``; returns slot -> Block of the blocks that
        outlive the run (the others were freed within it)."""
        a = self.allocator
        free = a.free_chunks
        device = a.device
        live = {}
        changed: dict = {}
        for key, index, pieces in self.patches:
            entries = free[key]
            old = entries[index][2]
            seg, before, after = old.segment, old.prev, old.next
            add = changed.setdefault(key, ([], []))
            add[0].append(index)
            for k, lo, size in pieces:
                chunk = Chunk(seg, lo, size, before)
                if before is None:
                    seg.first = chunk
                else:
                    before.next = chunk
                before = chunk
                if k is None:
                    add[1].append((size, lo, chunk))
                else:
                    nbytes = self.requested[k]
                    chunk.allocated = True
                    chunk.requested = nbytes
                    block = Block(bids[k], device, self.streams[k], chunk, nbytes, a)
                    chunk._owner = ref(block)
                    live[k] = block
            before.next = after
            if after is not None:
                after.prev = before
        for key, (dropped, added) in changed.items():
            entries = free[key]
            kept = [e for i, e in enumerate(entries) if i not in dropped] if len(dropped) > 1 else \
                entries[:dropped[0]] + entries[dropped[0] + 1:]
            kept.extend(added)
            kept.sort()
            entries[:] = kept
        a._log.extend(self.stats)
        if len(a._log) >= Stats.FOLD_AT:
            a.stats._fold()
        return live
