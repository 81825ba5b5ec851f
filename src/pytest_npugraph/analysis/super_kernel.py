"""``super-kernel``: SuperKernel scope misuse and early-start (``SetNextTaskStart``) overlap.

Sub-kernels of a SuperKernel run in order with a sync between each two, except that a sub-kernel
calling ``SetNextTaskStart`` (seed 004; its op profile says ``set_next_task_start``, carried as
``OpCores.early_start``) lets the next sub-kernel start before it finishes.  The emulator cannot see
where in the kernel the call sits, so the next sub-kernel on the same stream reading or overwriting
an output of the early-starting one is reported (the seed: call it after the last data move, and
keep what follows it from interfering with later sub-kernels).  Also reported: a scope end without
a begin of that name and a begin never ended (outside compiled graphs, whose compiler raises the
real errors), and as warnings a ``SetNextTaskStart`` op in no scope (no effect) and a scope whose
sub-kernels run on several streams without the ``stream-fusion=1`` option (docs: not recommended).
Nested scopes of different names are accepted by TorchAir (pairing is by name; the innermost scope
wins), so they are not reported.

Scopes are the ``SuperKernelBegin``/``SuperKernelEnd(stream, name, options)``
records: GE mode writes them around each run of ops of one ``torchair.scope.super_kernel`` name,
``torch.npu.super_kernel_scope_begin/end`` where they are called (captured graphs repeat them on
each replay).  A kernel belongs to the innermost scope open on its device (ranks of
``npugraph.run_ranks`` run side by side, each on its own device).  One pass over the trace.
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import Kernel, SuperKernelBegin, SuperKernelEnd
from . import contents, describe

KIND = "super-kernel"
_FIX = ("call SetNextTaskStart only after the last write (data move) of every output a following "
        "sub-kernel depends on, on every core and tiling branch (seed 004), or do not let the consumer be the "
        "next sub-kernel (an independent op between them, or the consumer outside the scope), or drop "
        "set_next_task_start from the op")


class _Open:
    __slots__ = ("begin", "name", "options", "last", "first")

    def __init__(self, begin):
        self.begin = begin
        self.name, self.options = begin.name, begin.options or ""
        self.last: dict = {}    # stream -> the scope's latest sub-kernel on it
        self.first: dict = {}   # stream -> the scope's first sub-kernel on it


def find(trace, cache: dict | None = None) -> list:
    if contents.of(trace, cache).no_super_kernel:
        return []       # no scope record and no early-starting kernel (contents.py)
    found: dict = {}
    open_by_device: dict = {}   # device -> its open scopes, innermost last (ranks run side by side)

    def scopes_of(rec) -> list:
        info = trace.streams.get(rec.stream) if rec.stream is not None else None
        return open_by_device.setdefault(info.device if info is not None else None, [])

    for rec in trace.records:
        if type(rec) is SuperKernelBegin:
            scopes_of(rec).append(_Open(rec))
        elif type(rec) is SuperKernelEnd:
            scopes = scopes_of(rec)
            name = rec.name
            scope = next((s for s in reversed(scopes) if s.name == name), None)
            if scope is None:
                _add(found, trace, [rec], [], f"super_kernel_scope_end({name!r}) at {describe.site(rec)} has no "
                     f"open super_kernel_scope_begin({name!r}) before it: begin and end must be called in pairs "
                     f"with the same scope name (compiled graphs raise 'No matching torch.npu.super_kernel_scope_"
                     f"begin found'). Fix: call super_kernel_scope_begin({name!r}) first, or remove the end.")
            else:
                scopes.remove(scope)
                _streams(found, trace, scope)
        elif type(rec) is Kernel and not (rec.graph is not None and rec.graph.capture):
            scopes = scopes_of(rec)
            if not scopes:
                if rec.cores.early_start:
                    _add(found, trace, [rec], [rec.op], f"{rec.op} at {describe.site(rec)} calls SetNextTaskStart "
                         "(its op profile sets set_next_task_start) outside any SuperKernel scope, where it has no "
                         "effect: SetNextTaskStart only lets the next sub-kernel of a SuperKernel start early. "
                         "Fix: put the op in a torchair.scope.super_kernel / torch.npu.super_kernel_scope_begin scope, "
                         "or drop the call.", severity="warning")
                continue
            scope = scopes[-1]
            prev = scope.last.get(rec.stream)
            if prev is not None and prev.cores.early_start:
                _overlap(found, trace, scope, prev, rec)
            scope.last[rec.stream] = rec
            scope.first.setdefault(rec.stream, rec)
    for scope in (s for scopes in open_by_device.values() for s in scopes):
        _add(found, trace, [scope.begin], [], f"super_kernel_scope_begin({scope.name!r}) at "
             f"{describe.site(scope.begin)} is never ended: every kernel issued after it falls into the SuperKernel "
             f"(compiled graphs raise 'there is no paired call to the torch.npu.super_kernel_scope_end operator'). "
             f"Fix: call super_kernel_scope_end({scope.name!r}) where the fused range ends.")
        _streams(found, trace, scope)
    return list(found.values())


def _overlap(found, trace, scope, prev, rec) -> None:
    reads = [s for s in rec.reads if any(s.overlaps(w) for w in prev.writes)]
    writes = [s for s in rec.writes if any(s.overlaps(w) for w in prev.writes)]
    if not (reads or writes):
        return
    span = (reads or writes)[0]
    what = describe.tensor(trace, span.block)
    verb = "reads" if reads else "overwrites"
    _add(found, trace, [prev, rec], [prev.op, rec.op],
         f"in SuperKernel scope {scope.name!r} (opened at {describe.site(scope.begin)}), {prev.op} at "
         f"{describe.site(prev)} calls SetNextTaskStart (its op profile sets set_next_task_start), so the next "
         f"sub-kernel {rec.op} at {describe.site(rec)} may start before {prev.op} has finished; {rec.op} {verb} "
         f"{what}, which {prev.op} writes, so it can {'read it partly written' if reads else 'have its writes undone by'}"
         f"{'' if reads else ' the rest of ' + prev.op}. Fix: {_FIX}.")


def _streams(found, trace, scope) -> None:
    if len(scope.first) < 2 or "stream-fusion=1" in scope.options.replace(" ", ""):
        return
    firsts = list(scope.first.values())
    names = ", ".join(describe.stream(trace, k.stream) for k in firsts)
    _add(found, trace, [scope.begin, *firsts], [k.op for k in firsts],
         f"SuperKernel scope {scope.name!r} (opened at {describe.site(scope.begin)}) has sub-kernels on several "
         f"streams ({names}) without the option stream-fusion=1: multi-stream inside a SuperKernel is not "
         f"recommended without it. Fix: keep the scope on one stream, or pass options='stream-fusion=1' "
         f"(torchair.scope.super_kernel(name, 'stream-fusion=1')).", severity="warning")


def _add(found, trace, records, ops, message, severity="error") -> None:
    where = list(dict.fromkeys(describe.site(r) for r in records))
    streams = list(dict.fromkeys(describe.stream(trace, r.stream) for r in records if r.stream is not None))
    key = (message[:40], tuple(where))
    if key not in found:
        found[key] = Hazard(KIND, message, where, streams, list(dict.fromkeys(ops)),
                            tuple(r.seq for r in records), severity)
