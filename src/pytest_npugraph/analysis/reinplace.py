"""``reinplace-conflict``: what TorchAir's reinplace passes do to a multi-stream graph.

The reduce-overhead compiler records one ``Reinplace`` marker (its ``verdict`` a ``ReinplaceVerdict``) per
candidate (``compiler/reinplace.py``) and, where the pass applies, runs the in-place op.

* **error**: an applied reinplace (inplaceable-ops pass) whose in-place write races with another
  stream's read (``races`` classifies the conflict): ``ReinplaceStreamChecker`` only compares the
  stream labels of the tensor node's direct users, so a view made on the in-place op's stream and
  read on another stream slips through, and the write the compiler introduced lands on memory that
  stream may still be reading.  The eager program (calling the functional op) was correct.
* **warning**: a pass the configuration asks for is vetoed because the mutated tensor's users are
  on several stream labels: the functional op stays and the graph pays a copy it did not expect.

The user's own in-place ops on a tensor another stream reads are plain races (``races``).
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import Reinplace
from . import contents, describe, races

KIND = "reinplace-conflict"


def find(trace, cache: dict | None = None) -> list:
    if contents.of(trace, cache).no_reinplace:
        return []       # no Reinplace marker: nothing applied or vetoed (contents.py)
    return _conflicts(trace, cache) + _vetoes(trace)


def _conflicts(trace, cache) -> list:
    """The conflicts ``races`` classified as a reinplaced write against another stream's read."""
    ops = races.reinplaced(trace)
    found = []
    for c in races.conflicts(trace, cache):
        if c.kind != KIND:
            continue
        write, read = (c.earlier, c.later) if c.earlier_writes else (c.later, c.earlier)
        v = races.reinplace_of(ops, write).verdict
        message = (
            f"TorchAir's reinplace {v.pass_name} pass turned {v.op} (node {v.node} of {v.graph}) at "
            f"{describe.site(write)} into {v.inplace_op}, which now writes {races.memory(trace, c)} in place on "
            f"{describe.stream(trace, write.stream)} while {describe.stream(trace, read.stream)} may still be reading "
            f"it in {read.op} at {describe.site(read)}; nothing orders the two. Where the model calls the functional "
            f"op, the race exists only in the compiled graph: ReinplaceStreamChecker compares the streams of the "
            f"tensor's direct users ({_users(v)}) and misses a view read on another stream. Fix: order the reading "
            f"stream before the update (npu_tagged_event_record after {read.op} on its stream, "
            f"npu_tagged_event_wait before the update), make the view inside the same stream scope as its reader, "
            f"or set config.debug.aclgraph.{v.switch} = True.")
        found.append(Hazard(KIND, message, [describe.site(write), describe.site(read)],
                            [describe.stream(trace, write.stream), describe.stream(trace, read.stream)],
                            [write.op, read.op], (c.earlier.seq, c.later.seq)))
    return found


def _vetoes(trace) -> list:
    found: dict = {}
    for rec in trace.records:
        if type(rec) is not Reinplace or rec.verdict.verdict != "vetoed":
            continue
        v = rec.verdict
        if (v.graph, v.node) in found:
            continue
        sites = [str(site) for _, _, site in v.users if site is not None]
        where = list(dict.fromkeys([describe.site(rec)] + sites))
        message = (
            f"the config asks for TorchAir's reinplace {v.pass_name} pass, but multi-stream disables it for node "
            f"{v.node} ({v.op}) of {v.graph} at {describe.site(rec)}: the tensor it would update in place is used on "
            f"streams {', '.join(repr(s) for s in v.streams)} ({_users(v)}; users at "
            f"{', '.join(where[1:]) or 'unknown'}), so ReinplaceStreamChecker keeps the functional op and you pay "
            f"a copy. Fix: keep every use of that tensor on one stream (tagged events between the users do not "
            f"count: the checker compares stream labels only), or silence it with "
            f"config.debug.aclgraph.{v.switch} = True if the copy is intended.")
        found[(v.graph, v.node)] = Hazard(KIND, message, where, list(v.streams), [v.op], (rec.seq,),
                                          severity="warning")
    return list(found.values())


def _users(verdict) -> str:
    return ", ".join(f"{name} on stream '{label}'" for name, label, _ in verdict.users)
