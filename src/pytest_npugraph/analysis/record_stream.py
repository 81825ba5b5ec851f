"""Missing ``record_stream`` (kind ``missing-record-stream``).

The caching allocator gives a freed block back to allocations on the block's allocation
stream A as soon as the host frees it; only streams named by ``record_stream`` delay that.
So a block used on another stream B, freed without ``record_stream(B)``, is a hazard when
A's next work can overlap that use.

Rule (the torch_npu NPU sanitizer's, anchors §1.10, checked later than it does):
block X allocated on A (``BlockInfo.stream``), read or written by a ``Kernel`` on B != A,
``Free``-d with no ``RecordStream(X, B)`` before the free, and the first ``Kernel`` issued
on A after the free is not ordered after X's last use on B.  The sanitizer checks at the
free; checking at A's next kernel keeps silent the vLLM-Ascend MoE pattern, where the main
stream drops the tensor and then joins the side stream (``wait_stream`` / event wait)
before doing more work.  A that never does more work is silent too.

It also reports the actual reuse the race engine sees (``races.Conflict`` of this kind):
the memory's new owner, on any stream, touching it while the old use on B may still run.
One report per (block, use stream); when the allocator did hand the address to a new
tensor (``Alloc.reuses``) the report names that tensor and its first write.

Memory used by a GE graph's own streams is out of scope: GE allocates the whole graph's memory
statically with cross-stream lifetimes accounted for, and ``record_stream`` cannot be called inside
a GE graph.  In reduce-overhead graphs the omission is real (a replay may overwrite memory a scope
stream still reads; TorchAir's answer is ``npu_record_tagged_stream``) and is reported.

Graph-pool blocks (``BlockInfo.pool``) are out of scope: their memory goes back to later
captures into the pool, not to the allocation stream, and ``record_stream`` does not guard it
(overlapping replays are races; outputs overwritten by a replay are ``output-overwrite``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hazard import Hazard
from ..trace import Alloc, Free, Kernel
from . import contents, describe, happens_before, races

KIND = "missing-record-stream"


@dataclass
class Finding:
    block: int            # the freed block X
    use: Kernel           # X's last use on the other stream B
    free: Free
    work: Kernel          # the later work not ordered after ``use``
    new_block: object = None   # bid of the tensor that got X's memory, if it was reused
    new_write: object = None   # that tensor's first write (a Kernel), if seen


def find(trace, cache: dict | None = None) -> list:
    if contents.of(trace, cache).no_conflicts:
        return []       # the rule needs kernels on two streams, and so does a conflict (contents.py)
    hb = happens_before.of(trace, cache)
    found, first_write = _scan(trace, hb)
    for c in races.conflicts(trace, cache):
        if c.kind != KIND:
            continue
        key = (c.earlier_span.block, c.earlier.stream)
        y = c.later_span.block
        write = first_write.get(y) or (c.later if c.later_writes else None)
        if key not in found:
            found[key] = Finding(key[0], c.earlier, c.freed, c.later, y, write)
        elif found[key].new_block is None:
            found[key].new_block, found[key].new_write = y, write
    return [_hazard(trace, f) for f in found.values()]


def _scan(trace, hb):
    """Rule pass: ``{(X, B): Finding}`` and the first write of each block that reused an address."""
    ge = {sid for sid in trace.streams if describe.ge_stream(trace, sid)}
    alloc_stream = {bid: info.stream for bid, info in trace.blocks.items()
                    if info.pool is None and info.stream not in ge}
    uses: dict = {}         # bid -> {sid: last Kernel using it there}, other streams only
    recorded_at_free = hb.memory.recorded_at_free
    pending: dict = {}      # sid A -> [(X, B, use, Free)] waiting for A's next kernel
    new_block: dict = {}    # X -> bid of the block that reused its address
    watch: set = set()      # reusing blocks whose first write is not seen yet
    first_write: dict = {}  # reusing bid -> first Kernel writing it
    found: dict = {}
    for rec in trace.records:
        cls = type(rec)
        if cls is Kernel:
            sid = rec.stream
            for spans in (rec.writes, rec.reads):
                for span in spans:
                    owner = alloc_stream.get(span.block)
                    if owner is not None and owner != sid:
                        per = uses.get(span.block)
                        if per is None:
                            uses[span.block] = {sid: rec}
                        else:
                            per[sid] = rec
            if watch:
                for span in rec.writes:
                    if span.block in watch:
                        watch.discard(span.block)
                        first_write[span.block] = rec
            todo = pending.pop(sid, None)
            if todo:
                for x, b, use, free in todo:
                    if (x, b) not in found and not hb.ordered(use.seq, rec.seq):
                        found[(x, b)] = Finding(x, use, free, rec, new_block.get(x))
        elif cls is Free:
            per = uses.pop(rec.block, None)
            covered = recorded_at_free(rec.block)
            if per:
                todo = pending.setdefault(alloc_stream[rec.block], [])
                todo.extend((rec.block, b, use, rec) for b, use in per.items() if b not in covered)
        elif cls is Alloc and rec.reuses is not None:
            new_block[rec.reuses] = rec.block
            watch.add(rec.block)
    for f in found.values():
        if f.new_block is None:
            f.new_block = new_block.get(f.block)
        if f.new_block is not None:
            f.new_write = first_write.get(f.new_block)
    return found, first_write


def _hazard(trace, f: Finding) -> Hazard:
    b, a = describe.stream(trace, f.use.stream), describe.stream(trace, f.work.stream)
    freed_at = f" at {describe.site(f.free)}" if describe.known(f.free) else ""
    parts = [
        f"missing-record-stream on {describe.tensor(trace, f.block)}: it was used on {b} by {f.use.op} "
        f"at {describe.site(f.use)}, then freed{freed_at} without `record_stream({b})`, and {a} went on "
        f"with {f.work.op} at {describe.site(f.work)}, which is not ordered after that use, so the caching "
        f"allocator may give the memory to a new tensor while {b} is still using it."]
    where = [describe.site(f.use)] + ([describe.site(f.free)] if freed_at else []) + [describe.site(f.work)]
    seqs = [f.use.seq, f.free.seq, f.work.seq]
    if f.new_block is not None:
        written = ""
        if f.new_write is not None:
            written = (f", first written by {f.new_write.op} at {describe.site(f.new_write)} on "
                       f"{describe.stream(trace, f.new_write.stream)}")
            if f.new_write is not f.work:
                where.append(describe.site(f.new_write))
                seqs.append(f.new_write.seq)
        parts.append(f"The allocator did reuse it for {describe.tensor(trace, f.new_block)}{written}.")
    if describe.mode(trace, f.use) == "reduce-overhead":
        parts.append(
            f"In reduce-overhead mode this is real: a replay may write the memory while {b} still uses it. Fix: "
            f"`torchair.ops.npu_record_tagged_stream(t, \"<tag of the stream scope at line {describe.site(f.use)}>\")` "
            f"on this tensor after its use there (`record_stream` is not captured), or order {a} after that use with "
            f"a tagged event (`npu_tagged_event_record` after line {describe.site(f.use)}, `npu_tagged_event_wait` "
            f"before line {describe.site(f.work)}).")
    else:
        parts.append(
            f"Fix: call `t.record_stream({describe.stream_expr(trace, f.use.stream)})` on this tensor before it is "
            f"freed{freed_at}, or make {a} wait for {b} "
            f"(`torch.npu.current_stream().wait_stream({describe.stream_expr(trace, f.use.stream)})` after line "
            f"{describe.site(f.use)} and before line {describe.site(f.work)}).")
    return Hazard(KIND, " ".join(parts), where, [b, a], [f.use.op, f.work.op], tuple(seqs))
