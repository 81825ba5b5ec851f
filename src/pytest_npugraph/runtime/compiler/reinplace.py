"""TorchAir's reinplace passes versus multi-stream, as far as a hazard checker needs them
(reference torchair_api.md §4.1 steps 7-8, §4.9, §7.12).

TorchAir runs, after the event passes and dead-code elimination of ``optimize_graph_without_runtime``:

* the reinplace-inplaceable-ops pass (``debug.aclgraph.disable_reinplace_inplaceable_ops_pass``):
  a functional op with an in-place variant (``add`` -> ``add_``) whose ``self`` is an intermediate
  tensor not used after it becomes the in-place op;
* the reinplace-input-mutated-ops pass (``debug.aclgraph.disable_reinplace_input_mutated_ops_pass``):
  a functional op whose result is copied back into a mutated graph input (``copy_`` epilogue) is
  folded into an in-place op on the input.

Both ask TorchAir's ``ReinplaceStreamChecker`` first: it gathers the users of the mutated input
(without ``copy_`` nodes, plus the ``copy_`` node's users) and requires them all to carry the same
``stream_label`` (fewer than two users pass).  Otherwise the reinplace is refused and the graph
keeps the functional op: a copy the configuration did not expect.  npugraph_ex is stricter but
event-aware: cross-stream users ordered against the in-place node by tagged events pass.

This module only decides the verdicts; the graph is left functional (the emulated result is the
same either way) and each verdict becomes ``Marker("reinplace", detail=(graph, node, op, verdict,
pass, switch, streams, user names, user sites, user streams), site=<the op's line>)`` for ``analysis/reinplace.py``.
Simplifications: views of the mutated tensor are not followed, multi-inplace NPU ops and
``auto_functionalized`` are not modelled, and the npugraph_ex event rule looks at direct
record -> wait pairs (no transitive fixed point).
"""
from __future__ import annotations

import torch

from . import fxgraph

INPLACEABLE = "disable_reinplace_inplaceable_ops_pass"
INPUT_MUTATED = "disable_reinplace_input_mutated_ops_pass"
_RECORD = ("air.tagged_event_record.default",)
_WAIT = ("air.tagged_event_wait.default",)


def _inplace_variant(target):
    if not isinstance(target, torch._ops.OpOverload):
        return None
    packet = target.overloadpacket
    name = packet.__name__
    if name.endswith("_") or name.startswith("copy"):
        return None
    namespace = getattr(torch.ops, target.namespace, None)
    inplace = getattr(namespace, name + "_", None) if namespace is not None else None
    if inplace is None:
        return None
    return getattr(inplace, target._overloadname, None)


def _same_meta(node, base) -> bool:
    a, b = node.meta.get("val"), base.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    return a.shape == b.shape and a.dtype == b.dtype


def _is_copy(node) -> bool:
    return node.target is torch.ops.aten.copy_.default


def _users(base) -> list:
    """``get_inplace_op_mutated_input_users`` for one input: non-copy users plus the copy's users."""
    users = []
    for user in base.users:
        if _is_copy(user):
            users.extend(user.users)
            continue
        users.append(user)
    return users


def _protected(node, users, order, nodes) -> bool:
    """npugraph_ex's ``verify_cross_stream_event_protected``, direct record -> wait pairs only."""
    mine = node.meta.get("stream_label")
    records = [(n.args[0], n.meta.get("stream_label"), order[n]) for n in nodes
               if fxgraph.target_name(n) in _RECORD and n.args]
    waits = [(n.args[0], n.meta.get("stream_label"), order[n]) for n in nodes
             if fxgraph.target_name(n) in _WAIT and n.args]

    def ordered(src_label, after, dst_label, before) -> bool:
        return any(rl == src_label and rp > after and wt == tag and wl == dst_label and rp < wp < before
                   for tag, rl, rp in records for wt, wl, wp in waits)

    for user in users:
        label = user.meta.get("stream_label")
        if label == mine or user is node:
            continue
        if order[user] < order[node]:
            if not ordered(label, order[user], mine, order[node]):
                return False
        elif not ordered(mine, order[node], label, order[user]):
            return False
    return True


def check(gm, config, graph_name: str) -> list:
    """The verdict of every reinplace candidate: (node, op, verdict, pass name, switch, streams, users)."""
    fxgraph.stream_labels(gm)
    debug = config.debug.aclgraph
    event_aware = config.mode.value == "npugraph_ex"
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    copies = {(n.args[0], n.args[1]) for n in nodes
              if _is_copy(n) and len(n.args) > 1 and getattr(n.args[0], "op", None) == "placeholder"}
    found = []
    for node in nodes:
        if node.op != "call_function" or _inplace_variant(node.target) is None:
            continue
        if not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        base = node.args[0]
        if base.op == "placeholder":
            if (base, node) not in copies:
                continue
            switch = INPUT_MUTATED
        elif base.op == "get_attr":
            continue
        else:
            switch = INPLACEABLE
        if not _same_meta(node, base):
            continue
        if any(order[u] > order[node] and not _is_copy(u) for u in base.users):
            continue        # can_inplace: the old value is read later, no pass would in-place it
        users = _users(base)
        labels = list(dict.fromkeys(u.meta.get("stream_label") for u in users))
        if getattr(debug, switch):
            verdict = "disabled"
        elif len(users) < 2 or len(labels) == 1:
            verdict = "applied"
        elif event_aware and _protected(node, users, order, nodes):
            verdict = "protected"
        else:
            verdict = "vetoed"
        found.append((node, verdict, switch, labels, users))
    return found


def emit(found, graph_name: str) -> None:
    """One ``Marker("reinplace")`` per verdict in the running test's trace."""
    from ..runtime import current

    rt = current()
    for node, verdict, switch, labels, users in found:
        sites = tuple(fxgraph.node_site(u) for u in users)
        detail = (graph_name, node.name, fxgraph.target_name(node), verdict,
                  "input-mutated" if switch == INPUT_MUTATED else "inplaceable", switch,
                  tuple("main" if label is None else str(label) for label in labels),
                  tuple(u.name for u in users), sites,
                  tuple("main" if u.meta.get("stream_label") is None else str(u.meta["stream_label"]) for u in users))
        rt.marker("reinplace", detail=detail, site=fxgraph.node_site(node))
