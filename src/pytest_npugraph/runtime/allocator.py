"""A model of torch_npu's caching allocator: per-stream pools, block splitting and reuse,
``record_stream`` deferring reuse, statistics and out-of-memory errors.

Addresses are simulated (a per-device address space); the CPU payload of a tensor lives
elsewhere.  What matters for the checks is *which simulated bytes* a tensor occupies, so that
a block handed out again after a free shows up as overlapping the old block's pending uses.
"""
from __future__ import annotations

import array
import itertools
import sys
import threading
from bisect import bisect_left, insort
from typing import Optional
from weakref import ref

MIN_BLOCK = 512                  # every size is rounded up to this
SMALL_SIZE = 1 << 20             # requests up to 1 MiB come from the small pool
SMALL_SEGMENT = 2 << 20          # small pool segments are 2 MiB
LARGE_SEGMENT = 20 << 20         # requests below 10 MiB get a 20 MiB segment
ROUND_LARGE = 2 << 20            # larger requests are rounded to 2 MiB
HUGE = 1 << 60                   # 1 EiB: "Tried to allocate more than 1EB memory."
BASE_ADDRESS = 0x12C0_0000_0000  # where simulated address spaces start
REGION = 1 << 40                 # each allocator (device of one test) gets its own region
_regions = itertools.count()


def round_size(size: int) -> int:
    return max(MIN_BLOCK, (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK)


def segment_size(size: int, small: bool) -> int:
    """What the allocator asks the device for to serve a (rounded) request of ``size``."""
    if small:
        return SMALL_SEGMENT
    if size < 10 * SMALL_SIZE:
        return LARGE_SEGMENT
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def format_size(n: int) -> str:
    """Sizes in messages, as the caching allocator prints them."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if n <= scale << 10:
            return f"{n / scale:.2f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


class Segment:
    """One device allocation, cut into address-ordered Chunks linked through ``prev``/``next``."""

    __slots__ = ("lo", "size", "stream", "small", "pool", "first", "free")

    def __init__(self, lo: int, size: int, stream: int, small: bool, pool, free: list):
        self.lo = lo
        self.size = size
        self.stream = stream
        self.small = small
        self.pool = pool
        self.first: Optional[Chunk] = None
        self.free = free        # its pool's free list (``CachingAllocator.free_chunks``)

    @property
    def blocks(self) -> list:
        """Its Chunks in address order."""
        out, chunk = [], self.first
        while chunk is not None:
            out.append(chunk)
            chunk = chunk.next
        return out


class Chunk:
    """A contiguous piece of a segment: allocated, pending (freed, awaiting streams) or cached free.
    ``prev``/``next``: its neighbours in the segment, so that a free merges without searching."""

    __slots__ = ("segment", "lo", "size", "allocated", "pending", "requested", "_owner", "prev", "next")

    def __init__(self, segment: Segment, lo: int, size: int, prev=None, next=None):
        self.segment = segment
        self.lo = lo
        self.size = size
        self.allocated = False  # handed out and not yet freed (the Block may be dying meanwhile)
        self.pending = False    # freed, waiting for recorded streams
        self.requested = 0      # bytes its Block asked for (until the chunk is inactive again)
        self._owner = None      # weakref to the Block: the tensors' death, not the pool, frees a block
        self.prev: Optional[Chunk] = prev
        self.next: Optional[Chunk] = next

    @property
    def owner(self) -> Optional["Block"]:
        """The live Block holding this chunk; None while it is cached free or pending."""
        return None if self._owner is None else self._owner()

    @property
    def hi(self) -> int:
        return self.lo + self.size

    @property
    def split(self) -> bool:
        return self.prev is not None or self.next is not None


class Block:
    """One allocation.  Shared by every tensor view of one storage; its death frees it."""

    __slots__ = ("bid", "device", "stream", "lo", "size", "requested", "chunk", "allocator",
                 "stream_uses", "freed", "__weakref__")

    def __init__(self, bid, device, stream, chunk, requested, allocator):
        self.bid = bid
        self.device = device
        self.stream = stream          # allocation stream (sid)
        self.lo = chunk.lo
        self.size = chunk.size
        self.requested = requested
        self.chunk = chunk
        self.allocator = allocator
        self.stream_uses: set = set()  # sids from record_stream
        self.freed = False

    def __del__(self, _finalizing=sys.is_finalizing):
        if self.freed or _finalizing():   # (interpreter exit: module globals are already None)
            return
        allocator = self.allocator
        if allocator is not None:
            try:
                frame = sys._getframe(1)    # where the last reference went: the Free's site
            except ValueError:              # none: it went in a thread of torch's (autograd's device threads)
                frame = None
            allocator.free(self, frame)


class _Stat:
    """One statistic of ``memory_stats``: current value, its peak, and the totals added and removed."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def as_dict(self) -> dict:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


_MAKING = threading.Lock()


class Stats:
    """The counters behind ``torch.npu.memory_stats``: each array per pool (all, large, small).

    Why a log: a malloc or free changes five to eight counters, and peaks must be exact, on every op,
    while few tests ever read them.  So the allocator logs each change as three ints in the
    ``log`` array (``code``, x, y), and reading the statistics applies the log: a short one counter by
    counter, a long one at once with torch (per-row deltas, prefix sums for the current values and
    their peaks, clamped sums for the totals added and removed): the same numbers either way.
    """

    ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")
    POOLS = ("all", "large_pool", "small_pool")
    COUNTERS = ("num_alloc_retries", "num_ooms", "num_oom_rejections", "num_sync_all_streams",
                "num_device_alloc", "num_device_free")
    # the kinds of change: each array's delta is constant + x * (x coefficient) + y * (y coefficient)
    KINDS = {
        "malloced": {"allocation": (1, 0, 0), "active": (1, 0, 0), "allocated_bytes": (0, 1, 0),
                     "active_bytes": (0, 1, 0), "requested_bytes": (0, 0, 1)},          # x: size, y: requested
        "freed": {"allocation": (-1, 0, 0), "allocated_bytes": (0, -1, 0)},              # x: size
        "released": {"active": (-1, 0, 0), "active_bytes": (0, -1, 0), "requested_bytes": (0, 0, -1)},
        "segment_added": {"segment": (1, 0, 0), "reserved_bytes": (0, 1, 0)},           # x: segment size
        "segment_removed": {"segment": (-1, 0, 0), "reserved_bytes": (0, -1, 0)},
        "split_added": {"inactive_split": (1, 0, 0), "inactive_split_bytes": (0, 1, 0)},  # x: its bytes
        "split_removed": {"inactive_split": (-1, 0, 0), "inactive_split_bytes": (0, -1, 0)},
        "split_shrunk": {"inactive_split_bytes": (0, -1, 0)},
    }
    CODES = {kind: i for i, kind in enumerate(KINDS)}
    FOLD_AT = 3 << 20           # ints in the log (24 MiB) before it is applied anyway
    ROWS_BY_HAND = 32           # a log up to this many changes is applied in Python (torch's fixed cost)
    # a longer one with torch, this many changes per pass: about 0.2 us per change while a pass fits in
    # the cache, 0.5-1.4 us per change in one pass over 10^5-10^6 changes
    ROWS_PER_PASS = 4096

    def __init__(self):
        self._table = None          # ``_values``, made when first read or applied (most tests never do)
        self.log = array.array("q")      # (code, x, y) per change: the allocator extends it
        self._folding = threading.Lock()
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self.oversize_allocations = _Stat()
        self.oversize_segments = _Stat()
        self.max_split_size = -1    # no max_split_size_mb configured
        self._plan = None           # ``_by_code``, made when a short log is first applied (few tests read stats)
        self.folds = 0              # times the log was applied (alloc_schedule.py: a run it watched must not span one)

    @property
    def _values(self) -> dict:
        """name -> pool -> ``_Stat`` (the log not applied)."""
        table = self._table
        if table is None:
            made = {n: {p: _Stat() for p in self.POOLS} for n in self.ARRAYS}
            with _MAKING:       # one table even if two threads read the statistics first at once
                if self._table is None:
                    self._table = made
            table = self._table
        return table

    @property
    def _by_code(self) -> list:
        """code -> ((constant, x coefficient, y coefficient, (its "all" _Stat, its pool's _Stat)), ...)"""
        if self._plan is None:
            values = self._values
            self._plan = [tuple((const, cx, cy, (values[name]["all"],
                                                 values[name]["small_pool" if code % 2 else "large_pool"]))
                                for name, (const, cx, cy) in changes.items())
                          for changes in self.KINDS.values() for code in (0, 1)]
        return self._plan

    @classmethod
    def code(cls, kind: str, small: bool = False) -> int:
        """The first int of a log entry: ``kind`` (``KINDS``) of change to the small or large pool."""
        return cls.CODES[kind] * 2 + small

    def _fold(self) -> None:
        """Apply the log.  The allocator may append to it meanwhile from another thread (``run_ranks``):
        the entries applied are taken as a copy and cut off the front, never the live array exported."""
        with self._folding:
            self.folds += 1
            n = len(self.log)
            log = self.log[:n]
            del self.log[:n]
            if n <= 3 * self.ROWS_BY_HAND:
                self._apply_by_hand(log)
            else:
                self._apply_vectorised(log)

    def _apply_by_hand(self, log) -> None:
        """A short log (a test reading the statistics often): counter by counter."""
        by_code = self._by_code
        for i in range(0, len(log), 3):
            x, y = log[i + 1], log[i + 2]
            for const, cx, cy, stats in by_code[log[i]]:
                amount = const + cx * x + cy * y
                for v in stats:
                    v.current += amount
                    if amount > 0:
                        v.allocated += amount
                        if v.current > v.peak:
                            v.peak = v.current
                    else:
                        v.freed -= amount

    def _apply_vectorised(self, log) -> None:
        import torch

        rows = torch.frombuffer(log, dtype=torch.int64).view(-1, 3)
        for start in range(0, len(rows), self.ROWS_PER_PASS):
            self._apply_rows(rows[start:start + self.ROWS_PER_PASS])

    def _apply_rows(self, rows) -> None:
        """Per-change deltas of the nine arrays, their prefix sums (the current values after each change,
        whose maxima are the peaks) and the sums of their magnitudes (with the net sums, the totals added
        and removed), for all changes and for the small pool's; the large pool's are the difference."""
        constant, per_x, per_y = _coefficient_tables()
        code = rows[:, 0]
        d = constant.index_select(0, code)
        d += rows[:, 1:2] * per_x.index_select(0, code)
        d += rows[:, 2:3] * per_y.index_select(0, code)
        d_small = d * (code & 1).unsqueeze(1)
        cum, cum_small = d.cumsum(0), d_small.cumsum(0)
        for pool, cum_pool, d_pool in (("all", cum, d), ("small_pool", cum_small, d_small),
                                       ("large_pool", cum - cum_small, d - d_small)):
            stats = [self._values[name][pool] for name in self.ARRAYS]
            net, magnitude = cum_pool[-1].tolist(), d_pool.abs().sum(0).tolist()
            for v, rise, change, most in zip(stats, net, magnitude, cum_pool.max(0).values.tolist()):
                v.peak = max(v.peak, v.current + most)
                v.current += rise
                v.allocated += (change + rise) // 2     # the sum of the positive deltas
                v.freed += (change - rise) // 2

    @classmethod
    def coefficients(cls) -> list:
        """``[kind][term][array]``: constant, x and y coefficient of each array's delta (``KINDS``)."""
        return [[[changes.get(name, (0, 0, 0))[term] for name in cls.ARRAYS] for term in range(3)]
                for changes in cls.KINDS.values()]

    @property
    def values(self) -> dict:
        """name -> pool -> ``_Stat``, with every logged change applied."""
        if self.log:
            self._fold()
        return self._values

    def current(self, name: str) -> int:
        return self.values[name]["all"].current

    def _all_stats(self):
        for arrays in self.values.values():
            yield from arrays.values()
        yield self.oversize_allocations
        yield self.oversize_segments

    def reset_peaks(self) -> None:
        for v in self._all_stats():
            v.peak = v.current

    def reset_accumulated(self) -> None:
        for v in self._all_stats():
            v.allocated = v.freed = 0
        for name in ("num_alloc_retries", "num_ooms", "num_oom_rejections", "num_sync_all_streams"):
            self.counters[name] = 0

    def as_nested_dict(self) -> dict:
        nested = {name: {pool: v.as_dict() for pool, v in arrays.items()} for name, arrays in self.values.items()}
        nested.update(self.counters)
        nested["max_split_size"] = self.max_split_size
        nested["oversize_allocations"] = self.oversize_allocations.as_dict()
        nested["oversize_segments"] = self.oversize_segments.as_dict()
        return nested


_tables: list = []


def _coefficient_tables():
    """``(constant, x, y)`` coefficient tables as torch tensors, indexed by log code: ``[code][array]``."""
    if not _tables:
        import torch

        coefficients = Stats.coefficients()
        _tables.extend(torch.tensor([coefficients[code // 2][term] for code in range(2 * len(Stats.KINDS))])
                       for term in range(3))
    return _tables


# the log codes of the allocator's changes (plus 1 for the small pool)
(_MALLOCED, _FREED, _RELEASED, _SEGMENT_ADDED, _SEGMENT_REMOVED, _SPLIT_ADDED, _SPLIT_REMOVED,
 _SPLIT_SHRUNK) = (Stats.code(kind) for kind in Stats.KINDS)


class CachingAllocator:
    """Per-device allocator.  ``on_alloc``/``on_free`` report to the runtime's trace.

    ``runtime.stream_completed(stream, mark)`` answers whether the host knows that stream's work
    up to ``mark`` finished; pending blocks (freed with recorded streams) become reusable only
    then, as the real allocator reuses them only once the events it recorded have completed.

    Every op mallocs and frees: those two are written out rather than split into helpers, merge
    through the chunks' neighbour links, and log their statistics changes in one ``extend`` each (in
    the order they happen: the peaks depend on it).
    """

    def __init__(self, device: int, capacity: int, runtime):
        self.device = device
        self.capacity = capacity
        self.runtime = runtime
        self.segments: list = []
        # (stream, small, pool) -> sorted list of (size, lo, Chunk): a freed block is reused only on its
        # allocation stream, in a graph pool too (as CUDA's private pools: torch_npu_api.md §5)
        self.free_chunks: dict = {}
        self.pending: list = []        # (chunk, {stream: mark})
        self.next_address = BASE_ADDRESS + next(_regions) * REGION
        self.reserved = 0
        self.stats = Stats()
        self._log = self.stats.log
        self._stat = self._log.extend  # logs changes of the statistics: (code, x, y) each
        self.fraction = 1.0
        self._busy = 0                 # > 0 while the pools are being changed
        self._deferred: list = []      # Blocks that died meanwhile (a finalizer run by the GC)
        self._activated = False        # runtime.devices[device].initialized set by a malloc

    @property
    def limit(self) -> int:
        return int(self.capacity * self.fraction)

    # ----------------------------------------------------------------- allocation
    def _locked(self, change, *args):
        """``change(*args)``, a change to the pools: serialised across threads; a Block freed by a
        finalizer in the middle of it (same thread) is queued and freed when it is complete."""
        with self.runtime.lock:
            self._busy += 1
            try:
                return change(*args)
            finally:
                self._busy -= 1
                while self._deferred and not self._busy:
                    self.free(self._deferred.pop())

    def malloc(self, nbytes: int, stream: int, pool=None) -> Block:
        """Best fit from the (stream, small, pool) free list, else a new segment; the rest of the chunk
        is split off when it is big enough.  Serialised as ``_locked``, written out (every op mallocs)."""
        lock = self.runtime.lock
        lock.acquire()      # not ``with``: acquire and release cost half as much
        try:
            self._busy += 1
            try:
                if nbytes >= HUGE:
                    raise self._oom(None)
                size = (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK     # round_size, inlined
                if size < MIN_BLOCK:
                    size = MIN_BLOCK
                small = size <= SMALL_SIZE
                if self.pending:
                    self._process_pending()
                chunk = None
                free = self.free_chunks.get((stream, small, pool))
                if free:
                    i = bisect_left(free, (size,))
                    if i < len(free):
                        chunk = free.pop(i)[2]
                if chunk is None:
                    chunk = self._new_segment(size, stream, small, pool)
                # split: the statistics count the inactive (free) pieces of segments cut in several
                was_split = chunk.prev is not None or chunk.next is not None
                rest = chunk.size - size
                if rest >= (MIN_BLOCK if small else SMALL_SIZE + 1):
                    seg = chunk.segment
                    after = chunk.next
                    chunk.next = tail = Chunk(seg, chunk.lo + size, rest, chunk, after)
                    if after is not None:
                        after.prev = tail
                    chunk.size = size
                    insort(seg.free, (rest, tail.lo, tail))
                    if was_split:       # an inactive split shrinks by the bytes taken
                        self._stat((_SPLIT_SHRUNK + small, size, 0, _MALLOCED + small, size, nbytes))
                    else:               # a new inactive split (the tail) appears
                        self._stat((_SPLIT_ADDED + small, rest, 0, _MALLOCED + small, size, nbytes))
                elif was_split:         # a whole inactive split becomes active
                    self._stat((_SPLIT_REMOVED + small, chunk.size, 0, _MALLOCED + small, chunk.size, nbytes))
                else:
                    self._stat((_MALLOCED + small, chunk.size, nbytes))
                block = Block(self.runtime.new_block_id(), self.device, stream, chunk, nbytes, self)
                chunk._owner = ref(block)
                chunk.allocated = True
                chunk.requested = nbytes
                if not self._activated:     # using a device activates it
                    self.runtime.devices[self.device].initialized = self._activated = True
                if len(self._log) >= Stats.FOLD_AT:      # applied now and then anyway, to bound it
                    self.stats._fold()
                return block
            finally:
                self._busy -= 1
                while self._deferred and not self._busy:
                    self.free(self._deferred.pop())
        finally:
            lock.release()

    def fits(self, nbytes: int, stream: int, pool=None) -> bool:
        """Whether ``malloc(nbytes)`` can succeed (asked before a big CPU payload is made)."""
        if nbytes >= HUGE:
            return False
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        free = self.free_chunks.get((stream, small, pool))
        if free and bisect_left(free, (size,)) < len(free):
            return True
        releasable = sum(seg.size for seg in self.segments if self._releasable(seg, pending_ok=True))
        return self.reserved - releasable + segment_size(size, small) <= self.limit

    def _new_segment(self, size, stream, small, pool) -> Chunk:
        seg_size = segment_size(size, small)
        if self.reserved + seg_size > self.limit:
            self.stats.counters["num_alloc_retries"] += 1
            self._empty_cache()
            if self.reserved + seg_size > self.limit:
                raise self._oom(seg_size)
        seg = Segment(self.next_address, seg_size, stream, small, pool,
                      self.free_chunks.setdefault((stream, small, pool), []))
        self.next_address += seg_size
        self.reserved += seg_size
        self.stats.counters["num_device_alloc"] += 1
        self._stat((_SEGMENT_ADDED + small, seg_size, 0))
        seg.first = chunk = Chunk(seg, seg.lo, seg_size)
        self.segments.append(seg)
        return chunk

    def _oom(self, seg_size: Optional[int]):
        import torch

        from .errors import ErrCode, pta_error

        self.stats.counters["num_ooms"] += 1
        if seg_size is None:
            return torch.OutOfMemoryError("NPU out of memory. Tried to allocate more than 1EB memory."
                                          + pta_error(ErrCode.MEMORY))
        allowed = f"{format_size(self.limit)} allowed; " if self.fraction < 1.0 else ""
        return torch.OutOfMemoryError(
            f"NPU out of memory. Tried to allocate {format_size(seg_size)} "
            f"(NPU {self.device}; {format_size(self.capacity)} total capacity; "
            f"{format_size(self.stats.current('allocated_bytes'))} already allocated; "
            f"{format_size(self.stats.current('active_bytes'))} current active; "
            f"{format_size(self.capacity - self.reserved)} free; {allowed}"
            f"{format_size(self.reserved)} reserved in total by PyTorch). If reserved memory is >> allocated "
            f"memory try setting max_split_size_mb to avoid fragmentation." + pta_error(ErrCode.MEMORY))

    # ----------------------------------------------------------------------- free
    def free(self, block: Block, frame=None) -> None:
        """Free ``block``; ``frame``: the frame that dropped its last reference (where the user's line
        is looked for first; by default our caller's).  Serialised as ``_locked``, written out."""
        if block.freed:
            return
        lock = self.runtime.lock
        lock.acquire()      # as in malloc
        try:
            if self._busy:
                self._deferred.append(block)
                return
            if block.freed:     # freed by another thread meanwhile
                return
            if frame is None:
                frame = sys._getframe(1)
            self._busy += 1
            try:
                block.freed = True
                chunk = block.chunk
                chunk._owner = None
                chunk.allocated = False
                freed = (_FREED + chunk.segment.small, chunk.size, 0)
                uses = block.stream_uses and block.stream_uses - {block.stream}
                if uses:    # the real allocator records an event on each and waits for them before reuse
                    chunk.pending = True
                    self._stat(freed)
                    self.pending.append((chunk, {s: self.runtime.stream_mark(s) for s in uses}))
                else:
                    self._release(chunk, freed)
                self.runtime.on_free(block, frame)
            finally:
                self._busy -= 1
                while self._deferred and not self._busy:
                    self.free(self._deferred.pop())
        finally:
            lock.release()

    def _release(self, chunk: Chunk, changes: tuple = ()) -> None:
        """Return a chunk to its pool (inactive now), merging it with free neighbours; ``changes``: the
        statistics changes that precede these (logged with them)."""
        chunk.pending = False
        seg = chunk.segment
        small = seg.small
        changes += (_RELEASED + small, chunk.size, chunk.requested)
        chunk.requested = 0
        after, before = chunk.next, chunk.prev
        if after is not None or before is not None:
            free = seg.free     # a free neighbour is cached there: (size, lo) is unique in it
            if after is not None and not after.allocated and not after.pending:
                del free[bisect_left(free, (after.size, after.lo))]
                changes += (_SPLIT_REMOVED + small, after.size, 0)
                chunk.size += after.size
                chunk.next = after = after.next
                if after is not None:
                    after.prev = chunk
            if before is not None and not before.allocated and not before.pending:
                del free[bisect_left(free, (before.size, before.lo))]
                changes += (_SPLIT_REMOVED + small, before.size, 0)
                chunk.lo = before.lo
                chunk.size += before.size
                chunk.prev = before = before.prev
                if before is None:
                    seg.first = chunk
                else:
                    before.next = chunk
            if after is not None or before is not None:
                changes += (_SPLIT_ADDED + small, chunk.size, 0)
        self._stat(changes)
        insort(seg.free, (chunk.size, chunk.lo, chunk))

    def _process_pending(self, synchronize: bool = False) -> None:
        """Release the pending chunks whose recorded streams completed; ``synchronize`` waits for
        them first (``empty_cache`` and the out-of-memory retry do, as in torch_npu)."""
        if not self.pending:
            return
        still = []
        for chunk, marks in self.pending:
            if synchronize:
                for s, m in marks.items():
                    self.runtime._learn(s, m)
            if all(self.runtime.stream_completed(s, m) for s, m in marks.items()):
                self._release(chunk)
            else:
                still.append((chunk, marks))
        self.pending = still

    @staticmethod
    def _releasable(seg: Segment, pending_ok: bool = False) -> bool:
        return all(not c.allocated and (pending_ok or not c.pending) for c in seg.blocks)

    def empty_cache(self) -> None:
        """Give every segment holding no live block back to the device (pending frees waited for)."""
        self._locked(self._empty_cache)

    def _empty_cache(self) -> None:
        self._process_pending(synchronize=True)
        keep = []
        for seg in self.segments:
            # a graph pool keeps its segments for the graphs captured into it (CUDA: until they die)
            if seg.pool is None and self._releasable(seg):
                for c in seg.blocks:
                    del seg.free[bisect_left(seg.free, (c.size, c.lo))]
                self.reserved -= seg.size
                self.stats.counters["num_device_free"] += 1
                self._stat((_SEGMENT_REMOVED + seg.small, seg.size, 0))
            else:
                keep.append(seg)
        self.segments = keep

    def cached_bytes(self) -> int:
        return sum(size for lst in self.free_chunks.values() for size, _, _ in lst)
