"""``reinplace-conflict``: what TorchAir's reinplace passes do to a multi-stream graph.

The reduce-overhead compiler records one ``Marker("reinplace", detail=ReinplaceVerdict)`` per
candidate (``runtime/compiler/reinplace.py``) and, where the pass applies, runs the in-place op.

* **error**: an applied reinplace (inplaceable-ops pass) whose in-place write races with another stream's access
  (``races`` classifies the conflict): ``ReinplaceStreamChecker`` only compares the stream labels
  of the tensor node's direct users, so a view made on the in-place op's stream and read on another
  stream (or a user only ordered by a data edge) slips through, and the write the compiler
  introduced lands on memory that stream may still be using.  The eager program was correct.
* **warning**: a pass the configuration asks for is vetoed because the mutated tensor's users are
  on several stream labels: the functional op stays and the graph pays a copy it did not expect.

The user's own in-place ops on a tensor another stream reads are plain races (``races``).
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import Marker
from . import describe, races

KIND = "reinplace-conflict"


def find(trace, cache: dict | None = None) -> list:
    return _conflicts(trace, cache) + _vetoes(trace)


def _conflicts(trace, cache) -> list:
    reinplaced = races._reinplaced(trace)
    found = []
    for c in races.conflicts(trace, cache):
        if c.kind != KIND:
            continue
        mine = races.reinplace_of(reinplaced, c.later) if c.later_writes else None
        write, other, other_writes = (c.later, c.earlier, c.earlier_writes) if mine else (c.earlier, c.later,
                                                                                          c.later_writes)
        verdict = (mine or races.reinplace_of(reinplaced, c.earlier)).detail
        doing = "writing" if other_writes else "reading"
        message = (
            f"TorchAir's reinplace {verdict.pass_name} pass turned {verdict.op} (node {verdict.node} of "
            f"{verdict.graph}) at {describe.site(write)} into {verdict.inplace_op}, which now writes "
            f"{races.memory(trace, c)} in place on {describe.stream(trace, write.stream)} while "
            f"{describe.stream(trace, other.stream)} may still be {doing} it in {other.op} at "
            f"{describe.site(other)}; nothing orders the two. Where the model calls the functional op, the race "
            f"exists only in the compiled graph: ReinplaceStreamChecker compares the streams of the tensor's "
            f"direct users ({_users(verdict)}) and misses a view read on another stream. Fix: order the {doing} stream before the update (npu_tagged_event_record after "
            f"{other.op} on its stream, npu_tagged_event_wait before the update), make the view inside the "
            f"same stream scope as its reader, or set config.debug.aclgraph.{verdict.switch} = True.")
        found.append(Hazard(KIND, message, [describe.site(write), describe.site(other)],
                            [describe.stream(trace, write.stream), describe.stream(trace, other.stream)],
                            [write.op, other.op], (c.earlier.seq, c.later.seq)))
    return found


def _vetoes(trace) -> list:
    found: dict = {}
    for rec in trace.records:
        if type(rec) is not Marker or rec.what != "reinplace" or rec.detail.verdict != "vetoed":
            continue
        v = rec.detail
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
            f"count: the checker compares stream labels only), or silence it with config.debug.aclgraph.{v.switch} = True if "
            f"the copy is intended.")
        found[(v.graph, v.node)] = Hazard(KIND, message, where, list(v.streams), [v.op], (rec.seq,),
                                          severity="warning")
    return list(found.values())


def _users(verdict) -> str:
    return ", ".join(f"{name} on stream '{label}'" for name, label, _ in verdict.users)
