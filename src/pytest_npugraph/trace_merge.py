"""Appending another process's trace to a test's trace, so the analyses see every rank at once.

Why: each process of a test (a ``torch.multiprocessing.spawn`` rank, a subprocess) records its own
trace, numbering its streams, events and blocks from its own counter and placing its allocations in
its own address space.  Appended as they are, two processes' ids would collide and their memory
would seem shared.  ``append`` renames what belongs to one process: ids get a per-process offset,
addresses an offset of their own (two processes never share bytes, even on one device), sequence
numbers become positions in the destination.  Device indices stay: rank r driving ``npu:r`` in its
process is ``npu:r`` of the test, and two processes on one device share its cores, as on hardware.

Fields are renamed by their name, the trace's conventions (trace.py): ``stream``, ``event``,
``block``/``reuses``, ``copy`` (a task's seq) and spans (``reads``, ``writes``, ``span``, ``spans``).
No torch here.
"""
from __future__ import annotations

from dataclasses import fields

from . import trace as T

ID_STRIDE = 1 << 40          # ids of the n-th appended process start at n * ID_STRIDE
ADDRESS_STRIDE = 1 << 48     # and its addresses, on a device shared, at n * ADDRESS_STRIDE (a device has < 2**40 bytes)


def _used_devices(trace: T.Trace) -> set:
    """The devices a trace did something on (a task, an event record or wait, an allocation)."""
    streams = {r.stream for r in trace.records if isinstance(r, (T.Kernel, T.EventRecord, T.EventWait))}
    return ({trace.streams[s].device for s in streams if s in trace.streams} |
            {b.device for b in trace.blocks.values()})


def append(dst: T.Trace, src: T.Trace, n: int, label: str = "", group=None) -> int:
    """Append ``src`` (another process's trace, its records made) to ``dst`` as process ``n`` (>= 1).
    When ``dst`` already used a device ``src`` uses (the test's process, or another child, on the same
    NPU), ``src``'s addresses move apart and ``label`` (e.g. "rank 1") marks its streams and events in
    reports.  ``group(name)``: the name of ``src``'s communicator ``name`` in ``dst`` (``Kernel.collective``,
    ``GroupCreated.group``; default: the same).  Returns the number of records appended."""
    group = group or (lambda name: name)
    base = len(dst.log)
    have_devices = _used_devices(dst)
    shared = bool(have_devices & _used_devices(src))
    ids, addr = n * ID_STRIDE, (n * ADDRESS_STRIDE if shared else 0)
    have_cores = {r.device for r in dst.records if isinstance(r, T.DeviceCores)}
    have_groups = {(r.group, r.devices) for r in dst.records if isinstance(r, T.GroupCreated)}

    def span(s: T.Span) -> T.Span:
        return T.Span(s.device, s.lo + addr, s.hi + addr, s.block + ids, s.run, s.dims)

    def rename(name: str, value):
        if value is None:
            return None
        if name in ("stream", "event", "block", "reuses"):
            return value + ids
        if name == "copy":
            return seqs.get(value, value + base)
        if name == "span":
            return span(value)
        if name in ("reads", "writes", "spans"):
            return tuple(span(s) for s in value)
        if name == "collective":
            return (group(value[0]), value[1])
        if name == "group":
            return group(value)
        return value

    for sid, info in src.streams.items():
        label_ = info.label if not shared or not label else f"{info.label} ({label})"
        dst.streams[sid + ids] = T.StreamInfo(sid + ids, info.device, info.stream_id, label_)
    for eid, info in src.events.items():
        dst.events[eid + ids] = T.EventInfo(eid + ids, info.label + (f" ({label})" if label and shared else ""), info.site,
                                            info.external, info.tag)
    for bid, b in src.blocks.items():
        dst.block_log[bid + ids] = T.BlockInfo(bid + ids, b.device, b.stream + ids, b.lo + addr, b.hi + addr,
                                               b.size, b.site, b.pool)
    out, seqs = [], {}
    for record in src.records:
        if isinstance(record, T.DeviceCores):
            if record.device in have_cores:
                continue
            have_cores.add(record.device)
        if isinstance(record, T.GroupCreated):
            if (group(record.group), record.devices) in have_groups:
                continue
            have_groups.add((group(record.group), record.devices))
        seqs[record.seq] = base + len(out)
        values = [base + len(out) if f.name == "seq" else rename(f.name, getattr(record, f.name))
                  for f in fields(record)]
        out.append(type(record)(*values))
    dst.log.extend(out)
    return len(out)
