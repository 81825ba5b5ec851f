"""Names for report texts: streams, sites, tensors, accesses, and the fixes to suggest.

Why: a hazard message must read well to someone who never saw the plugin, so every
analysis names things the same way (stream labels, ``path:line``, allocation sites).
"""
from __future__ import annotations

from ..trace import GRAPH_STREAM_BASE, UNKNOWN_SITE


def stream(trace, sid) -> str:
    info = trace.streams.get(sid)
    return info.label if info is not None else f"stream#{sid}"


def made_at(trace, hazard) -> str:
    """The lines that made the eager streams a report names, once per report:
    ``streams made at: npu:0/stream-0, npu:0/stream-1 at test_x.py:12`` ("" when it names none)."""
    by_site: dict = {}
    for info in trace.streams.values():
        if info.site != UNKNOWN_SITE and info.label in hazard.streams:
            by_site.setdefault(str(info.site), []).append(info.label)
    if not by_site:
        return ""
    return "streams made at: " + "; ".join(f"{', '.join(sorted(labels))} at {site}"
                                            for site, labels in sorted(by_site.items()))


def stream_key(trace, sid) -> tuple:
    """(device, label): orders streams in reports by what users see, not by ids (a
    process-wide counter, so they depend on the ranks' thread timing)."""
    info = trace.streams.get(sid)
    return (info.device, info.label) if info is not None else (-1, stream(trace, sid))


def rotated(cycle: list, key) -> list:
    """``cycle`` started at its smallest node by ``key``: the same cycle reads the same
    whichever node the search met first."""
    if not cycle:
        return cycle
    start = min(range(len(cycle)), key=lambda i: key(cycle[i]))
    return cycle[start:] + cycle[:start]


def by_device(trace, hazards: list) -> list:
    """``hazards`` device by device (the device of each one's first record with a known device),
    each device's in the order given; a hazard with no known device goes last.

    Why: under ``run_ranks`` each device is driven by its own thread, so the trace interleaves the
    ranks' records in thread-timing order and an analysis that reports in trace order lists the
    same hazards in another order on every run.  One device's records are its thread's program
    order, so each device's part of the list is already stable.  A list from one device (every
    single-device test) comes back unchanged."""
    if len(hazards) < 2:
        return hazards
    by_seq: dict = {}
    devices = [_device(trace, h, by_seq) for h in hazards]
    if len({d for d in devices if d is not None}) < 2:
        return hazards
    order = sorted(range(len(hazards)), key=lambda i: (devices[i] is None, devices[i] or 0, i))
    return [hazards[i] for i in order]


def _device(trace, hazard, by_seq: dict):
    """The device of ``hazard``: of its first record (``seqs``) on a known stream, block or device,
    else of its first stream known by label; None if none is."""
    records = trace.records
    for seq in hazard.seqs:
        rec = records[seq] if 0 <= seq < len(records) and records[seq].seq == seq else None
        if rec is None:             # ExternalEvent waits moved after their records: seqs are not positions
            if not by_seq:
                by_seq.update((r.seq, r) for r in records)
            rec = by_seq.get(seq)
        info = trace.streams.get(getattr(rec, "stream", None)) or trace.blocks.get(getattr(rec, "block", None))
        device = info.device if info is not None else getattr(rec, "device", None)
        if device is not None:
            return device
    devices = {info.label: info.device for info in trace.streams.values()}
    return next((devices[s] for s in hazard.streams if s in devices), None)


def site(rec) -> str:
    return str(getattr(rec, "site", UNKNOWN_SITE))


def known(rec) -> bool:
    return getattr(rec, "site", UNKNOWN_SITE) != UNKNOWN_SITE


def tensor(trace, bid) -> str:
    """``the tensor allocated at foo.py:3 on npu:0/default (4096 bytes at 0x1000 of npu:0)``."""
    info = trace.blocks.get(bid)
    if info is None:
        return f"block #{bid}"
    where = "" if info.site == UNKNOWN_SITE else f" at {info.site}"
    pool = f", graph pool {info.pool}" if info.pool is not None else ""
    return (f"the tensor allocated{where} on {stream(trace, info.stream)} "
            f"({info.hi - info.lo} bytes at {info.lo:#x} of npu:{info.device}{pool})")


def overlap(trace, bid, lo, hi, strided: bool = False) -> str:
    """Where ``[lo, hi)`` lies in block ``bid``: empty when it is the whole block.  ``strided``: a
    strided view takes part, so the two share elements within that range, not every byte of it."""
    info = trace.blocks.get(bid)
    shared = "sharing elements within" if strided else "overlapping in"
    if info is None:
        return f", {shared} bytes [{lo:#x}, {hi:#x})"
    if (info.lo, info.hi) == (lo, hi) and not strided:
        return ""
    return f", {shared} its bytes [{lo - info.lo}, {hi - info.lo})"


def access(trace, kernel, writes: bool) -> str:
    """``npu:0/side writes it in aten::add_ at foo.py:12``."""
    verb = "writes" if writes else "reads"
    return f"{stream(trace, kernel.stream)} {verb} it in {kernel.op} at {site(kernel)}"


def ge_stream(trace, sid) -> bool:
    """A GE graph's own stream (``npu:0/decode_step:main``, ``npu:0/decode_step:tag '1'``): GE plans that graph's
    memory statically, cross-stream lifetimes included, so the caching allocator's reuse rules (and
    ``record_stream``) do not apply to it."""
    info = trace.streams.get(sid)
    return info is not None and info.stream_id >= GRAPH_STREAM_BASE


def mode(trace, kernel) -> str:
    """Where a kernel ran, for fix texts in the right idiom: "ge" (a GE graph's own streams),
    "reduce-overhead" (a TorchAir aclgraph replay), "capture" (a ``torch.npu.graph`` replay) or "eager"."""
    if ge_stream(trace, kernel.stream):
        return "ge"
    graph = getattr(kernel, "graph", None)
    if graph is not None:
        return "capture" if graph.key is None else "reduce-overhead"   # NPUGraph has no aclgraph key
    return "eager"


def stream_expr(trace, sid) -> str:
    """A Python expression for a stream where one exists, else a placeholder naming it."""
    label = stream(trace, sid)
    if label.endswith("/default"):
        return "torch.npu.default_stream()"
    info = trace.streams.get(sid)
    if info is not None and info.site != UNKNOWN_SITE:
        return f"<the stream made at {info.site}>"
    return f"<the stream object of {label}>"


def order_fix(trace, first, then) -> str:
    """How to make record ``first`` happen before record ``then`` (on another stream), as code in the
    idiom of where they ran, to paste at the named lines."""
    a, b = stream(trace, first.stream), stream(trace, then.stream)
    l1, l2 = site(first), site(then)
    modes = {mode(trace, first), mode(trace, then)}
    if modes == {"reduce-overhead"}:
        return (f"in the compiled model, order the two with a tagged event (stream waits are not captured in "
                f"reduce-overhead mode): create it once, `ev = torchair.ops.npu_create_tagged_event(tag=\"...\")`, "
                f"call `torchair.ops.npu_tagged_event_record(ev)` after line {l1} in its stream scope and "
                f"`torchair.ops.npu_tagged_event_wait(ev)` before line {l2} in its stream scope" +
                (f" (line {l1} runs in both scopes: record after its first run, wait before its second)"
                 if l1 == l2 else ""))
    if modes == {"ge"}:
        return (f"GE orders a stream's data inputs itself but this access has no data edge to the other one: add one "
                f"before line {l2} with `torchair.ops.npu_wait_tensor(<the tensor used at {l2}>, <the tensor "
                f"written at {l1}>)`")
    wait = f"`torch.npu.current_stream().wait_stream({stream_expr(trace, first.stream)})`"
    if l1 == l2:
        return (f"line {l1} runs on {a} and then on {b} (a loop or a function called once per stream) and nothing "
                f"orders the second run after the first: just before the run on {b}, make it wait for {a}: {wait}, "
                f"or record an event on {a} after the first run and wait for it on {b}")
    return (f"record an event on {a} after line {l1} and wait for it on {b} before line {l2}: for example "
            f"{wait} just before line {l2}")
