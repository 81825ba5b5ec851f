"""The caching allocator before its fast path (commit c262f07), the oracle of test_allocator_fastpath.py:
verbatim below this docstring but for one absolute import."""
from __future__ import annotations

import array
import bisect
import itertools
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Optional

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


@dataclass(eq=False)
class Segment:
    lo: int
    size: int
    stream: int
    small: bool
    pool: Optional[object]
    blocks: list = field(default_factory=list)  # address-ordered Chunks


@dataclass(eq=False)
class Chunk:
    """A contiguous piece of a segment: allocated, pending (freed, awaiting streams) or cached free."""

    segment: Segment
    lo: int
    size: int
    allocated: bool = False  # handed out and not yet freed (the Block may be dying meanwhile)
    pending: bool = False    # freed, waiting for recorded streams
    requested: int = 0       # bytes its Block asked for (until the chunk is inactive again)
    _owner: Optional["weakref.ref"] = None   # weak: the tensors' death, not the pool, frees a block

    @property
    def owner(self) -> Optional["Block"]:
        """The live Block holding this chunk; None while it is cached free or pending."""
        return None if self._owner is None else self._owner()

    @owner.setter
    def owner(self, block: Optional["Block"]) -> None:
        self._owner = None if block is None else weakref.ref(block)
        self.allocated = block is not None

    @property
    def hi(self) -> int:
        return self.lo + self.size

    @property
    def split(self) -> bool:
        return len(self.segment.blocks) > 1


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
        if _finalizing():     # interpreter exit: module globals are already None; nothing left to account
            return
        allocator = self.allocator
        if allocator is not None and not self.freed:
            allocator.free(self, sys._getframe(1))   # where the last reference went: the Free's site


class _Stat:
    """One statistic of ``memory_stats``: current value, its peak, and the totals added and removed."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def as_dict(self) -> dict:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


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
    ROWS_BY_HAND = 256          # a log up to this many changes is applied in Python, a longer one with torch

    def __init__(self):
        self._values = {n: {p: _Stat() for p in self.POOLS} for n in self.ARRAYS}
        self.log = array.array("q")      # (code, x, y) per change: the allocator extends it
        self._folding = threading.Lock()
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self.oversize_allocations = _Stat()
        self.oversize_segments = _Stat()
        self.max_split_size = -1    # no max_split_size_mb configured

    @classmethod
    def code(cls, kind: str, small: bool = False) -> int:
        """The first int of a log entry: ``kind`` (``KINDS``) of change to the small or large pool."""
        return cls.CODES[kind] * 2 + small

    def _fold(self) -> None:
        """Apply the log.  The allocator may append to it meanwhile from another thread (``run_ranks``):
        the entries applied are taken as a copy and cut off the front, never the live array exported."""
        with self._folding:
            n = len(self.log)
            log = self.log[:n]
            del self.log[:n]
            if n <= 3 * self.ROWS_BY_HAND:
                self._apply_by_hand([log[i:i + 3] for i in range(0, n, 3)])
            else:
                self._apply_vectorised(log)

    def _apply_by_hand(self, rows) -> None:
        """A short log (a test reading the statistics often): counter by counter."""
        kinds = list(self.KINDS.values())
        for code, x, y in rows:
            small = code % 2
            for name, (const, cx, cy) in kinds[code // 2].items():
                amount = const + cx * x + cy * y
                pools = self._values[name]
                for v in (pools["all"], pools["small_pool" if small else "large_pool"]):
                    v.current += amount
                    if amount > 0:
                        v.allocated += amount
                        v.peak = max(v.peak, v.current)
                    else:
                        v.freed -= amount

    def _apply_vectorised(self, log) -> None:
        import torch

        rows = torch.frombuffer(log, dtype=torch.int64).view(-1, 3)
        kind, small = rows[:, 0] // 2, rows[:, 0] % 2
        c = torch.tensor(_COEFFICIENTS)[kind]              # (rows, 3, arrays)
        deltas = c[:, 0] + rows[:, 1:2] * c[:, 1] + rows[:, 2:3] * c[:, 2]
        for pool, mask in (("all", None), ("small_pool", small == 1), ("large_pool", small == 0)):
            d = deltas if mask is None else deltas * mask.unsqueeze(1)
            stats = [self._values[name][pool] for name in self.ARRAYS]
            current = torch.tensor([v.current for v in stats]) + d.cumsum(0)
            peaks = current.max(0).values.tolist()
            added = d.clamp(min=0).sum(0).tolist()
            removed = (-d).clamp(min=0).sum(0).tolist()
            for v, now, peak, plus, minus in zip(stats, current[-1].tolist(), peaks, added, removed):
                v.current = now
                v.peak = max(v.peak, peak)
                v.allocated += plus
                v.freed += minus

    @classmethod
    def coefficients(cls) -> list:
        """``[kind][term][array]``: constant, x and y coefficient of each array's delta (``KINDS``)."""
        return [[[changes.get(name, (0, 0, 0))[term] for name in cls.ARRAYS] for term in range(3)]
                for changes in cls.KINDS.values()]

    def fold_if_long(self) -> None:
        if len(self.log) >= self.FOLD_AT:
            self._fold()

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


_COEFFICIENTS = Stats.coefficients()
# the log codes of the allocator's changes (plus 1 for the small pool)
(_MALLOCED, _FREED, _RELEASED, _SEGMENT_ADDED, _SEGMENT_REMOVED, _SPLIT_ADDED, _SPLIT_REMOVED,
 _SPLIT_SHRUNK) = (Stats.code(kind) for kind in Stats.KINDS)


class CachingAllocator:
    """Per-device allocator.  ``on_alloc``/``on_free`` report to the runtime's trace.

    ``runtime.stream_completed(stream, mark)`` answers whether the host knows that stream's work
    up to ``mark`` finished; pending blocks (freed with recorded streams) become reusable only
    then, as the real allocator reuses them only once the events it recorded have completed.
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
        self._stat = self.stats.log.extend     # logs one change of the statistics: (code, x, y)
        self.fraction = 1.0
        self._busy = 0                 # > 0 while the pools are being changed
        self._deferred: list = []      # Blocks that died meanwhile (a finalizer run by the GC)

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
        with self.runtime.lock:             # as _locked, without its extra call (every op mallocs)
            self._busy += 1
            try:
                return self._malloc(nbytes, stream, pool)
            finally:
                self._busy -= 1
                while self._deferred and not self._busy:
                    self.free(self._deferred.pop())

    def _malloc(self, nbytes: int, stream: int, pool) -> Block:
        if nbytes >= HUGE:
            raise self._oom(None)
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        if self.pending:
            self._process_pending()
        chunk = self._take_cached(size, stream, small, pool)
        if chunk is None:
            chunk = self._new_segment(size, stream, small, pool)
        chunk = self._split(chunk, size)
        block = Block(self.runtime.new_block_id(), self.device, stream, chunk, nbytes, self)
        chunk.owner = block
        chunk.requested = nbytes
        self.runtime.devices[self.device].initialized = True   # using a device activates it
        self._stat((_MALLOCED + small, chunk.size, nbytes))
        self.stats.fold_if_long()
        return block

    def fits(self, nbytes: int, stream: int, pool=None) -> bool:
        """Whether ``malloc(nbytes)`` can succeed (asked before a big CPU payload is made)."""
        if nbytes >= HUGE:
            return False
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        free = self.free_chunks.get((stream, small, pool))
        if free and bisect.bisect_left(free, (size, -1)) < len(free):
            return True
        releasable = sum(seg.size for seg in self.segments if self._releasable(seg, pending_ok=True))
        return self.reserved - releasable + segment_size(size, small) <= self.limit

    def _take_cached(self, size, stream, small, pool) -> Optional[Chunk]:
        free = self.free_chunks.get((stream, small, pool))
        if not free:
            return None
        i = bisect.bisect_left(free, (size, -1))
        if i == len(free):
            return None
        _, _, chunk = free.pop(i)
        return chunk

    def _new_segment(self, size, stream, small, pool) -> Chunk:
        seg_size = segment_size(size, small)
        if self.reserved + seg_size > self.limit:
            self.stats.counters["num_alloc_retries"] += 1
            self._empty_cache()
            if self.reserved + seg_size > self.limit:
                raise self._oom(seg_size)
        seg = Segment(self.next_address, seg_size, stream, small, pool)
        self.next_address += seg_size
        self.reserved += seg_size
        self.stats.counters["num_device_alloc"] += 1
        self._stat((_SEGMENT_ADDED + small, seg_size, 0))
        chunk = Chunk(seg, seg.lo, seg_size)
        seg.blocks.append(chunk)
        self.segments.append(seg)
        return chunk

    def _split(self, chunk: Chunk, size: int) -> Chunk:
        """Carve ``size`` bytes off a free chunk, keeping the inactive-split statistics."""
        small = chunk.segment.small
        was_split = chunk.split
        rest = chunk.size - size
        if rest >= (MIN_BLOCK if small else SMALL_SIZE + 1):
            tail = Chunk(chunk.segment, chunk.lo + size, rest)
            chunk.size = size
            blocks = chunk.segment.blocks
            blocks.insert(blocks.index(chunk) + 1, tail)
            self._cache(tail)
            if was_split:       # an inactive split shrinks by the bytes taken
                self._stat((_SPLIT_SHRUNK + small, size, 0))
            else:               # a new inactive split (the tail) appears
                self._stat((_SPLIT_ADDED + small, rest, 0))
        elif was_split:         # a whole inactive split becomes active
            self._stat((_SPLIT_REMOVED + small, chunk.size, 0))
        return chunk

    def _cache(self, chunk: Chunk) -> None:
        seg = chunk.segment
        bisect.insort(self.free_chunks.setdefault((seg.stream, seg.small, seg.pool), []),
                      (chunk.size, chunk.lo, chunk))

    def _uncache(self, chunk: Chunk) -> None:
        seg = chunk.segment
        self.free_chunks[(seg.stream, seg.small, seg.pool)].remove((chunk.size, chunk.lo, chunk))

    def _oom(self, seg_size: Optional[int]):
        import torch

        from pytest_npugraph.runtime.errors import ErrCode, pta_error

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
        is looked for first)."""
        if block.freed:
            return
        with self.runtime.lock:
            if self._busy:
                self._deferred.append(block)
                return
            self._locked(self._free, block, frame)

    def _free(self, block: Block, frame=None) -> None:
        if block.freed:
            return
        block.freed = True
        chunk = block.chunk
        chunk.owner = None
        small = chunk.segment.small
        self._stat((_FREED + small, chunk.size, 0))
        self.runtime.on_free(block, frame)
        uses = block.stream_uses and block.stream_uses - {block.stream}
        if uses:    # the real allocator records an event on each and waits for them before reuse
            chunk.pending = True
            self.pending.append((chunk, {s: self.runtime.stream_mark(s) for s in uses}))
        else:
            self._release(chunk)

    def _release(self, chunk: Chunk) -> None:
        """Return a chunk to its pool (inactive now), merging it with free neighbours."""
        chunk.pending = False
        small = chunk.segment.small
        self._stat((_RELEASED + small, chunk.size, chunk.requested))
        chunk.requested = 0
        blocks = chunk.segment.blocks
        if len(blocks) > 1:
            i = blocks.index(chunk)
            for j in (i + 1, i - 1):     # the next one first: ``i`` stays this chunk's index
                if 0 <= j < len(blocks):
                    other = blocks[j]
                    if not other.allocated and not other.pending:
                        self._uncache(other)
                        self._stat((_SPLIT_REMOVED + small, other.size, 0))
                        chunk.lo = min(chunk.lo, other.lo)
                        chunk.size += other.size
                        del blocks[j]
            if len(blocks) > 1:
                self._stat((_SPLIT_ADDED + small, chunk.size, 0))
        self._cache(chunk)

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
                    self._uncache(c)
                self.reserved -= seg.size
                self.stats.counters["num_device_free"] += 1
                self._stat((_SEGMENT_REMOVED + seg.small, seg.size, 0))
            else:
                keep.append(seg)
        self.segments = keep

    def cached_bytes(self) -> int:
        return sum(size for lst in self.free_chunks.values() for size, _, _ in lst)
