"""``reinplace-conflict``: a TorchAir reinplace pass the configuration asks for, vetoed by multi-stream.

The reduce-overhead compiler records one ``Marker("reinplace", detail=(graph, node, op, verdict,
pass, switch, streams, user names, user sites, user streams), site=<the op's line>)`` per reinplace candidate
(``runtime/compiler/reinplace.py``).  ``verdict`` is ``"applied"`` (single stream), ``"protected"``
(npugraph_ex: cross-stream users ordered by tagged events), ``"disabled"`` (the ``debug.aclgraph``
switch turned the pass off) or ``"vetoed"``: TorchAir's ``ReinplaceStreamChecker`` found the mutated
tensor's users on more than one stream label, so the functional op stays and the graph pays a copy
(and the memory) the configuration expected to save.  Each vetoed node is a warning.

The user's own in-place ops on a tensor another stream reads are races (``analysis/races.py``).
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import Marker
from . import describe

KIND = "reinplace-conflict"


def find(trace) -> list:
    found: dict = {}
    for rec in trace.records:
        if type(rec) is not Marker or rec.what != "reinplace" or rec.detail[3] != "vetoed":
            continue
        graph, node, op, _, pass_name, switch, streams, users, sites = rec.detail[:9]
        where = list(dict.fromkeys([describe.site(rec)] + [_site(s) for s in sites if s is not None]))
        key = (graph, node)
        if key in found:
            continue
        shown = ", ".join(f"{u} on stream '{s}'" for u, s in zip(users, _user_streams(rec)))
        message = (
            f"the config asks for TorchAir's reinplace {pass_name} pass, but multi-stream disables it for node "
            f"{node} ({op}) of {graph} at {describe.site(rec)}: the tensor it would update in place is used on "
            f"streams {', '.join(repr(s) for s in streams)} ({shown}; users at {', '.join(where[1:]) or 'unknown'}), "
            f"so ReinplaceStreamChecker keeps the functional op and you pay a copy. Fix: keep every use of that "
            f"tensor on one stream (or use npugraph_ex, which accepts event-protected cross-stream users), or "
            f"silence it with config.debug.aclgraph.{switch} = True if the copy is intended.")
        found[key] = Hazard(KIND, message, where, list(streams), [op], (rec.seq,), severity="warning")
    return list(found.values())


def _site(site) -> str:
    return str(site)


def _user_streams(rec) -> list:
    """Stream of each user, in order (the marker keeps the distinct labels; users are shown with theirs)."""
    return list(rec.detail[9]) if len(rec.detail) > 9 else ["?"] * len(rec.detail[7])
