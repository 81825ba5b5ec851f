"""A model of torch_npu's caching allocator: per-stream pools, block splitting and reuse,
``record_stream`` deferring reuse, statistics and out-of-memory errors.

Addresses are simulated (a per-device address space); the CPU payload of a tensor lives
elsewhere.  What matters for the checks is *which simulated bytes* a tensor occupies, so that
a block handed out again after a free shows up as overlapping the old block's pending uses.
"""
from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

MIN_BLOCK = 512                  # every size is rounded up to this
SMALL_SIZE = 1 << 20             # requests up to 1 MiB come from the small pool
SMALL_SEGMENT = 2 << 20          # small pool segments are 2 MiB
LARGE_SEGMENT = 20 << 20         # requests below 10 MiB get a 20 MiB segment
ROUND_LARGE = 2 << 20            # larger requests are rounded to 2 MiB
BASE_ADDRESS = 0x12C0_0000_0000  # where simulated address spaces start
REGION = 1 << 40                 # each allocator (device of one test) gets its own region
_regions = itertools.count()


def round_size(size: int) -> int:
    return max(MIN_BLOCK, (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK)


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


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
    """A contiguous piece of a segment: either allocated (owner set) or cached free."""

    segment: Segment
    lo: int
    size: int
    owner: Optional["Block"] = None
    pending: bool = False  # freed, waiting for recorded streams

    @property
    def hi(self) -> int:
        return self.lo + self.size


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

    def __del__(self):
        allocator = self.allocator
        if allocator is not None and not self.freed:
            allocator.free(self)


class Stats:
    """The counters behind ``torch.npu.memory_stats`` (the ``.all`` pool)."""

    NAMES = ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes",
             "active_bytes", "requested_bytes")

    def __init__(self):
        self.values = {n: {"current": 0, "peak": 0, "allocated": 0, "freed": 0} for n in self.NAMES}
        self.num_alloc_retries = 0
        self.num_ooms = 0

    def add(self, name: str, amount: int) -> None:
        v = self.values[name]
        v["current"] += amount
        if amount > 0:
            v["allocated"] += amount
        else:
            v["freed"] -= amount
        v["peak"] = max(v["peak"], v["current"])

    def reset_peaks(self) -> None:
        for v in self.values.values():
            v["peak"] = v["current"]

    def reset_accumulated(self) -> None:
        for v in self.values.values():
            v["allocated"] = v["freed"] = 0
        self.num_alloc_retries = self.num_ooms = 0

    def as_dict(self) -> "OrderedDict":
        out = OrderedDict()
        for name, v in sorted(self.values.items()):
            for pool in ("all", "large_pool", "small_pool"):
                for stat, value in v.items():
                    out[f"{name}.{pool}.{stat}"] = value if pool == "all" else 0
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        return out


class CachingAllocator:
    """Per-device allocator.  ``on_alloc``/``on_free`` report to the runtime's trace.

    ``completed(stream, mark)`` answers whether the host knows that stream's work up to
    ``mark`` finished; pending blocks (freed with recorded streams) become reusable only then.
    """

    def __init__(self, device: int, capacity: int, runtime):
        self.device = device
        self.capacity = capacity
        self.runtime = runtime
        self.segments: list = []
        self.free_chunks: dict = {}    # (stream, small, pool) -> sorted list of (size, lo, Chunk)
        self.pending: list = []        # (chunk, {stream: mark})
        self.next_address = BASE_ADDRESS + next(_regions) * REGION
        self.reserved = 0
        self.stats = Stats()
        self.fraction = 1.0

    # ----------------------------------------------------------------- allocation
    def malloc(self, nbytes: int, stream: int, pool=None) -> Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        self._process_pending()
        chunk = self._take_cached(size, stream, small, pool)
        if chunk is None:
            chunk = self._new_segment(size, stream, small, pool, nbytes)
        chunk = self._split(chunk, size)
        block = Block(self.runtime.new_block_id(), self.device, stream, chunk, nbytes, self)
        chunk.owner = block
        self.stats.add("allocation", 1)
        self.stats.add("active", 1)
        self.stats.add("allocated_bytes", chunk.size)
        self.stats.add("active_bytes", chunk.size)
        self.stats.add("requested_bytes", nbytes)
        return block

    def _key(self, stream, small, pool):
        # graph pools are shared by every stream that captures into them
        return (None if pool is not None else stream, small, pool)

    def _take_cached(self, size, stream, small, pool) -> Optional[Chunk]:
        free = self.free_chunks.get(self._key(stream, small, pool))
        if not free:
            return None
        i = bisect.bisect_left(free, (size, -1))
        if i == len(free):
            return None
        _, _, chunk = free.pop(i)
        return chunk

    def _new_segment(self, size, stream, small, pool, requested) -> Chunk:
        seg_size = SMALL_SEGMENT if small else (
            LARGE_SEGMENT if size < 10 * SMALL_SIZE else (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE)
        limit = int(self.capacity * self.fraction)
        if self.reserved + seg_size > limit:
            self.stats.num_alloc_retries += 1
            self.empty_cache()
            if self.reserved + seg_size > limit:
                self.stats.num_ooms += 1
                raise self._oom(requested)
        seg = Segment(self.next_address, seg_size, stream, small, pool)
        self.next_address += seg_size
        self.reserved += seg_size
        self.stats.add("segment", 1)
        self.stats.add("reserved_bytes", seg_size)
        chunk = Chunk(seg, seg.lo, seg_size)
        seg.blocks.append(chunk)
        self.segments.append(seg)
        return chunk

    def _split(self, chunk: Chunk, size: int) -> Chunk:
        rest = chunk.size - size
        threshold = MIN_BLOCK if chunk.segment.small else SMALL_SIZE + 1
        if rest >= threshold:
            tail = Chunk(chunk.segment, chunk.lo + size, rest)
            chunk.size = size
            blocks = chunk.segment.blocks
            blocks.insert(blocks.index(chunk) + 1, tail)
            self._cache(tail)
        return chunk

    def _cache(self, chunk: Chunk) -> None:
        seg = chunk.segment
        bisect.insort(self.free_chunks.setdefault(self._key(seg.stream, seg.small, seg.pool), []),
                      (chunk.size, chunk.lo, chunk))

    def _uncache(self, chunk: Chunk) -> None:
        seg = chunk.segment
        self.free_chunks[self._key(seg.stream, seg.small, seg.pool)].remove((chunk.size, chunk.lo, chunk))

    def _oom(self, requested: int):
        import torch

        from .errors import ErrCode, pta_error

        if requested >= 1 << 60:
            return torch.OutOfMemoryError("NPU out of memory. Tried to allocate more than 1EB memory.")
        allocated = self.stats.values["allocated_bytes"]["current"]
        free = self.capacity - self.reserved
        return torch.OutOfMemoryError(
            f"NPU out of memory. Tried to allocate {format_size(round_size(requested))} "
            f"(NPU {self.device}; {format_size(self.capacity)} total capacity; "
            f"{format_size(allocated)} already allocated; "
            f"{format_size(self.stats.values['active_bytes']['current'])} current active; "
            f"{format_size(free)} free; {format_size(self.reserved)} reserved in total by PyTorch)."
            + pta_error(ErrCode.MEMORY))

    # ----------------------------------------------------------------------- free
    def free(self, block: Block) -> None:
        if block.freed:
            return
        block.freed = True
        chunk = block.chunk
        chunk.owner = None
        self.stats.add("allocation", -1)
        self.stats.add("active", -1)
        self.stats.add("allocated_bytes", -chunk.size)
        self.stats.add("active_bytes", -chunk.size)
        self.stats.add("requested_bytes", -block.requested)
        self.runtime.on_free(block)
        uses = block.stream_uses - {block.stream}
        if uses:
            chunk.pending = True
            self.pending.append((chunk, {s: self.runtime.stream_mark(s) for s in uses}))
        else:
            self._release(chunk)

    def _release(self, chunk: Chunk) -> None:
        """Return a chunk to its pool, merging it with free neighbours."""
        chunk.pending = False
        blocks = chunk.segment.blocks
        i = blocks.index(chunk)
        for j in (i + 1, i - 1):
            if 0 <= j < len(blocks):
                other = blocks[j]
                if other.owner is None and not other.pending:
                    self._uncache(other)
                    lo = min(chunk.lo, other.lo)
                    chunk.size += other.size
                    chunk.lo = lo
                    blocks.remove(other)
        self._cache(chunk)

    def _process_pending(self) -> None:
        if not self.pending:
            return
        still = []
        for chunk, marks in self.pending:
            if all(self.runtime.stream_completed(s, m) for s, m in marks.items()):
                self._release(chunk)
            else:
                still.append((chunk, marks))
        self.pending = still

    def empty_cache(self) -> None:
        """Release every segment that holds no live or pending block."""
        self._process_pending()
        keep = []
        for seg in self.segments:
            if all(c.owner is None and not c.pending for c in seg.blocks):
                for c in seg.blocks:
                    self._uncache(c)
                self.reserved -= seg.size
                self.stats.add("segment", -1)
                self.stats.add("reserved_bytes", -seg.size)
            else:
                keep.append(seg)
        self.segments = keep

    def cached_bytes(self) -> int:
        return sum(size for lst in self.free_chunks.values() for size, _, _ in lst)
