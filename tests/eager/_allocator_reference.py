"""The caching allocator before its fast path (commit c262f07), the oracle of test_allocator_fastpath.py.

Its allocation logic (Segment, Chunk, Block, CachingAllocator) is c262f07's verbatim but for one
absolute import and the statistics fold; the constants, size helpers and ``Stats`` are the module under
test's (``Stats`` has its own oracle in test_allocator_stats.py), so both allocators log into the same
kind of statistics and the comparison is of what they log."""
from __future__ import annotations

import bisect
import sys
import weakref
from dataclasses import dataclass, field
from typing import Optional

from pytest_npugraph.runtime.allocator import (  # noqa: F401 - shared with the allocator under test
    BASE_ADDRESS, HUGE, MIN_BLOCK, REGION, SMALL_SIZE, Stats, _FREED, _MALLOCED, _RELEASED, _SEGMENT_ADDED,
    _SEGMENT_REMOVED, _SPLIT_ADDED, _SPLIT_REMOVED, _SPLIT_SHRUNK, _regions, format_size, round_size,
    segment_size)


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
        if len(self.stats.log) >= Stats.FOLD_AT:
            self.stats._fold()
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
