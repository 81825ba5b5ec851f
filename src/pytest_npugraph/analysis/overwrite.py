"""``output-overwrite``: a graph call's output read after a later replay wrote over it.

A replayed graph (reduce-overhead/npugraph_ex, ``make_graphed_callables``) writes its outputs to
fixed addresses of its memory pool, so each call returns handles onto the same static buffers.  The
trace names each call's outputs (``GraphOutputs(call, spans)``, ``call`` a ``GraphCall``) and
each later use of one of its handles (``GraphOutputRead(call, span)``).  A use is stale when, between the call and the use, a replayed task (``Kernel.graph`` set:
the same key again, another key of the same FX graph, another graph sharing the pool) wrote bytes of
that output: the code reads the newer call's values (torch's CUDA graph trees raise "accessing tensor
output of CUDAGraphs that has been overwritten by a subsequent run" in that case; TorchAir does not).

Graphs captured with the raw ``torch.npu.graph``/``NPUGraph`` API name no calls; there the bytes say
it.  A tensor allocated in a graph pool owns its memory (its block); a replay of a graph captured
when that memory belonged to another, dead tensor of the pool (another graph sharing the pool,
``pool=``) writes there under the old owner's block.  A later read of the live tensor (eager, or by
another replay) before its own graph rewrites it sees the other graph's values: the docs' rule that
graphs sharing a pool must replay in the order they were captured.

Silent with ``enable_output_clone`` (the handles are clones, never tagged), in GE mode (no replay),
and when each output is consumed before the next call (the vLLM pattern).  One pass over the trace.
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import Alloc, Free, GraphOutputRead, GraphOutputs, Kernel
from . import contents, describe

KIND = "output-overwrite"


def find(trace, cache: dict | None = None) -> list:
    if contents.of(trace, cache).no_overwrite:
        return []       # no graph kernel: nothing replayed over an output (contents.py)
    calls: dict = {}      # call id -> (marker, [[span, overwriting kernel or None], ...])
    fresh: list = []      # [span, call id] of outputs not yet overwritten
    found: dict = {}
    pool = _PoolOwners(trace)
    for rec in trace.records:
        cls = type(rec)
        if cls is Kernel:
            for span in rec.reads:
                writer = pool.clobbered.get(span.block)
                if writer is not None and any(w.overlaps(span) for w in writer.writes):
                    _report_pool(trace, found, span.block, writer, rec)
            if rec.graph is not None and not rec.graph.capture and rec.writes:
                pool.replayed(rec)
                if fresh:
                    fresh = _overwrite(rec, fresh, calls)
            for span in rec.writes:
                pool.clobbered.pop(span.block, None)      # the owner rewrote it
        elif cls is Alloc or cls is Free:
            pool.track(rec, cls is Alloc)
        elif cls is GraphOutputs:
            entries = [[s, None] for s in rec.spans]
            calls[rec.call] = (rec, entries)
            fresh.extend((entry, rec.call) for entry in entries)
            pool.tagged.update(s.block for s in rec.spans)
        elif cls is GraphOutputRead:
            if rec.call not in calls:
                continue
            producer, entries = calls[rec.call]
            hit = next((e[1] for e in entries if e[1] is not None and e[0].overlaps(rec.span)), None)
            if hit is not None:
                _report(trace, found, producer, hit, rec)
    return list(found.values())


class _PoolOwners:
    """Live graph-pool blocks per device, and those a replay wrote over under another block."""

    def __init__(self, trace):
        self.blocks = trace.blocks
        self.live: dict = {}        # device -> {bid: BlockInfo}
        self.clobbered: dict = {}   # bid -> the replayed kernel that last wrote over it
        self.tagged: set = set()    # blocks of named call outputs (reported per call instead)

    def track(self, rec, alive: bool) -> None:
        info = self.blocks.get(rec.block)
        if info is None or info.pool is None:
            return
        owners = self.live.setdefault(info.device, {})
        if alive:
            owners[info.bid] = info
        else:
            owners.pop(info.bid, None)
            self.clobbered.pop(info.bid, None)

    def replayed(self, kernel) -> None:
        for w in kernel.writes:
            for bid, info in self.live.get(w.device, {}).items():
                if bid != w.block and bid not in self.tagged and info.lo < w.hi and w.lo < info.hi:
                    self.clobbered[bid] = kernel


def _overwrite(kernel, fresh, calls) -> list:
    """Mark the outputs ``kernel`` writes over; the rest stay fresh."""
    left = []
    for entry, call in fresh:
        if any(entry[0].overlaps(w) for w in kernel.writes):
            entry[1] = kernel
        else:
            left.append((entry, call))
    return left


def _overwriting_call(trace, kernel):
    """The ``graph_outputs`` marker of the call whose replay ran ``kernel`` (None: a bare
    ``NPUGraph.replay``, which names no outputs)."""
    graph = (kernel.graph.name, kernel.graph.key)     # not the label: two keys can show alike
    for rec in trace.records[kernel.seq + 1:]:
        if type(rec) is GraphOutputs and (rec.call.name, rec.call.key) == graph:
            return rec
    return None


def _report(trace, found, producer, kernel, read) -> None:
    key, replay = producer.call.key, producer.call.replay
    later = _overwriting_call(trace, kernel)
    over = later if later is not None else kernel
    key_of = (describe.site(producer), describe.site(over), describe.site(read))
    if key_of in found:
        return
    what = producer.call.label
    if later is not None:
        by = f"the call at {describe.site(later)} (replay {later.call.replay} of {later.call.label})"
    else:
        by = f"a replay of {kernel.graph.label} ({kernel.op} captured at {describe.site(kernel)})"
    compiled = key is not None
    fix = ("set config.debug.aclgraph.enable_output_clone = True, " if compiled else "") + (
        f".clone() the output you keep at {describe.site(producer)}, or consume it (sample, copy to the host) "
        "before the next call")
    message = (f"the output of {what} returned by the call at {describe.site(producer)} (replay {replay}) is read at "
               f"{describe.site(read)} after {by} overwrote it: a replayed graph writes its outputs to the same "
               f"fixed addresses of its memory pool on every call, so the read sees the later call's values, not "
               f"this call's. Fix: {fix}.")
    where = list(dict.fromkeys(key_of))
    streams = list(dict.fromkeys(describe.stream(trace, s) for s in (kernel.stream, read.stream) if s is not None))
    found[key_of] = Hazard(KIND, message, where, streams, [kernel.op],
                           tuple(r.seq for r in (producer, kernel, read)))


def _report_pool(trace, found, bid, writer, read) -> None:
    graph = writer.graph.label
    key_of = (str(trace.blocks[bid].site), describe.site(writer), describe.site(read))
    if key_of in found:
        return
    message = (f"{describe.tensor(trace, bid)} is read by {read.op} at {describe.site(read)} after a replay of "
               f"{graph} wrote over it ({writer.op} captured at {describe.site(writer)}): that graph was captured "
               f"when this memory of the shared pool belonged to one of its own tensors, and it writes there on "
               f"every replay, so the read sees that graph's values. Graphs sharing a pool must replay in the "
               f"order they were captured, each output consumed before another graph of the pool replays. Fix: "
               f"consume or .clone() the output before replaying {graph}, replay the graphs in capture order, or "
               f"capture them into separate pools.")
    where = list(dict.fromkeys(key_of))
    streams = list(dict.fromkeys(describe.stream(trace, s) for s in (writer.stream, read.stream)))
    found[key_of] = Hazard(KIND, message, where, streams, [writer.op, read.op], (writer.seq, read.seq))
