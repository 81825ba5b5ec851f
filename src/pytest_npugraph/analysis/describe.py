"""Names for report texts: streams, sites, tensors, accesses, and the fixes to suggest.

Why: a hazard message must read well to someone who never saw the plugin, so every
analysis names things the same way (stream labels, ``path:line``, allocation sites).
"""
from __future__ import annotations

from ..trace import UNKNOWN_SITE


def stream(trace, sid) -> str:
    info = trace.streams.get(sid)
    return info.label if info is not None else f"stream#{sid}"


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


def order_fix(trace, first, then) -> str:
    """How to make record ``first`` happen before record ``then`` (on another stream)."""
    a, b = stream(trace, first.stream), stream(trace, then.stream)
    return (f"record an event on {a} after line {site(first)} and wait for it on {b} before "
            f"line {site(then)} (for example `{b}.wait_stream({a})` just before {site(then)})")
