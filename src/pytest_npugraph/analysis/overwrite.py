"""``output-overwrite``: a graph call's output read after a later replay wrote over it.

A replayed graph (reduce-overhead/npugraph_ex, ``make_graphed_callables``) writes its outputs to
fixed addresses of its memory pool, so each call returns handles onto the same static buffers.  The
trace names each call's outputs (``Marker("graph_outputs", detail=(name, key, replay, spans))``) and
each later use of one of its handles (``Marker("graph_output_read", detail=((name, key, replay),
span))``).  A use is stale when, between the call and the use, a replayed task (``Kernel.graph`` set:
the same key again, another key of the same FX graph, another graph sharing the pool) wrote bytes of
that output: the code reads the newer call's values (torch's CUDA graph trees raise "accessing tensor
output of CUDAGraphs that has been overwritten by a subsequent run" in that case; TorchAir does not).

Silent with ``enable_output_clone`` (the handles are clones, never tagged), in GE mode (no replay),
and when each output is consumed before the next call (the vLLM pattern).  One pass over the trace.
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import Kernel, Marker
from . import describe

KIND = "output-overwrite"


def find(trace) -> list:
    calls: dict = {}      # call id -> (marker, [[span, overwriting kernel or None], ...])
    fresh: list = []      # [span, call id] of outputs not yet overwritten
    found: dict = {}
    for rec in trace.records:
        if type(rec) is Kernel:
            if rec.graph is not None and "#replay" in rec.graph and rec.writes and fresh:
                fresh = _overwrite(rec, fresh, calls)
        elif type(rec) is Marker:
            if rec.what == "graph_outputs":
                call = rec.detail[:3]
                entries = [[s, None] for s in rec.detail[3]]
                calls[call] = (rec, entries)
                fresh.extend((entry, call) for entry in entries)
            elif rec.what == "graph_output_read":
                call, span = rec.detail
                if call not in calls:
                    continue
                producer, entries = calls[call]
                hit = next((e[1] for e in entries if e[1] is not None and e[0].overlaps(span)), None)
                if hit is not None:
                    _report(trace, found, producer, hit, rec)
    return list(found.values())


def _overwrite(kernel, fresh, calls) -> list:
    """Mark the outputs ``kernel`` writes over; the rest stay fresh."""
    left = []
    for entry, call in fresh:
        if any(entry[0].overlaps(w) for w in kernel.writes):
            entry[1] = kernel
        else:
            left.append((entry, call))
    return left


def _label(name, key) -> str:
    return name if key is None else f"{name}[{key}]"


def _overwriting_call(trace, kernel):
    """The ``graph_outputs`` marker of the call whose replay ran ``kernel`` (None: a bare
    ``NPUGraph.replay``, which names no outputs)."""
    label = kernel.graph.rsplit("#replay", 1)[0]
    for rec in trace.records[kernel.seq + 1:]:
        if type(rec) is Marker and rec.what == "graph_outputs" and _label(*rec.detail[:2]) == label:
            return rec
    return None


def _report(trace, found, producer, kernel, read) -> None:
    name, key, replay = producer.detail[:3]
    later = _overwriting_call(trace, kernel)
    over = later if later is not None else kernel
    key_of = (describe.site(producer), describe.site(over), describe.site(read))
    if key_of in found:
        return
    what = _label(name, key)
    if later is not None:
        by = f"the call at {describe.site(later)} (replay {later.detail[2]} of {_label(*later.detail[:2])})"
    else:
        by = f"a replay of {kernel.graph.rsplit('#replay', 1)[0]} ({kernel.op} captured at {describe.site(kernel)})"
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
