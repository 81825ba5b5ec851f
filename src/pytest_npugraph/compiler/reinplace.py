"""TorchAir's reinplace passes versus multi-stream (reference torchair_api.md §4.1 steps 7-8, §4.9).

TorchAir runs, after the event passes and dead-code elimination of ``optimize_graph_without_runtime``:

* the reinplace-inplaceable-ops pass (``debug.aclgraph.disable_reinplace_inplaceable_ops_pass``,
  ``reinplace_with_multi_stream_check``): a functional op with an in-place variant (``add`` ->
  ``add_``) whose ``self`` is an intermediate (not aliasing a graph input) with no alias read after
  it becomes the in-place op;
* the reinplace-input-mutated-ops pass (``debug.aclgraph.disable_reinplace_input_mutated_ops_pass``,
  ``_mutated_input_reinplace``): a functional op whose result is copied back into the graph input it
  read (``copy_`` epilogue) becomes the in-place op on the input and the ``copy_`` goes;
* both treat the registered multi-inplace NPU ops (``npu_add_rms_norm_v2_functional`` [0, 1], ...)
  the same way: the ``_functional`` op becomes its in-place twin when every mutated input is a graph
  input with a ``copy_`` epilogue (input-mutated) or an intermediate (inplaceable);
* the input-mutated pass also decides, per base of an ``auto_functionalized(_v2)`` node (a custom op
  with mutable arguments), whether the decomposition that follows (inductor's
  ``decompose_auto_functionalized``) clones it or lets the op update it in place.

Both ask ``ReinplaceStreamChecker`` first: the users of the mutated tensor *node* (without ``copy_``
nodes, plus the ``copy_`` node's users) must all carry one ``stream_label`` (fewer than two pass).
It looks at direct users only: a view of the tensor made on the in-place node's stream and read on
another stream passes the check, the pass applies, and the in-place write races with that read on
the device although the eager program was correct.  Refused candidates keep the functional op: a
copy the configuration did not expect.  TorchAir's ``mode="npugraph_ex"`` runs these same passes and
checker.  The standalone npugraph_ex backend (``backend="npugraph_ex"``) asks
``verify_cross_stream_event_protected`` instead (``_event_protected`` below): every user on another
stream than the in-place node must be ordered after it, or before it, by a chain of the graph's
``npugraph_ex`` tagged event records and waits (by graph position and the nodes' stream labels; a
``wait_stream`` does not count).  Its users on the node's own stream need nothing, so one user on
another stream without events vetoes the reinplace that TorchAir's checker would apply.

Applied candidates are rewritten to the in-place op, so the emulated device writes where the real
one does, and every candidate becomes a ``Reinplace`` marker (``verdict=trace.ReinplaceVerdict(...)``,
``site=<the op's line>``) for ``analysis/reinplace.py``.
Not modelled: ``{view}_scatter`` folding.
"""
from __future__ import annotations

import logging
import operator
from typing import Optional

import torch

from ..runtime.ops import registry as ops_registry
from ..trace import ReinplaceVerdict as Verdict
from . import fxgraph

INPLACEABLE = "disable_reinplace_inplaceable_ops_pass"
INPUT_MUTATED = "disable_reinplace_input_mutated_ops_pass"
# TorchAir's ``register_inplaceable_npu_op`` table: functional op -> (in-place op, mutated arg indices).
# Read off the op specs (``OpSpec.reinplace``).
MULTI_INPLACE = ops_registry.multi_inplace()


def _label(node) -> str:
    label = node.meta.get("stream_label")
    return "main" if label is None else str(label)


def _storage(node) -> Optional[int]:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    if not isinstance(val, torch.Tensor) or not torch._C._has_storage(val):
        return None
    return val.untyped_storage()._cdata


def _inplace_op(node):
    """(in-place OpOverload, mutated arg indices) of a reinplace candidate, else None."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target.overloadpacket.__name__
    if target.namespace == "npu" and name in MULTI_INPLACE:
        inplace_name, mutated = MULTI_INPLACE[name]
        packet = getattr(torch.ops.npu, inplace_name, None)
        return (getattr(packet, target._overloadname, None), mutated) if packet is not None else None
    if name.endswith("_") or name.startswith("copy") or not target._schema.arguments:
        return None
    if not isinstance(target._schema.arguments[0].type, torch.TensorType):
        return None
    packet = getattr(getattr(torch.ops, target.namespace, None), name + "_", None)
    inplace = getattr(packet, target._overloadname, None) if packet is not None else None
    return (inplace, (0,)) if inplace is not None else None


def _is_copy(node) -> bool:
    return node.target is torch.ops.aten.copy_.default


def _users(base, result=None) -> list:
    """``get_inplace_op_mutated_input_users`` for one mutated input: its non-copy users, then (when a
    ``copy_`` writes it back) the other users of the copied value if that is a ``getitem`` and the
    copy's users; for a multi-inplace op on an intermediate also the users of its new value."""
    users, copy = [], None
    for user in base.users:
        if _is_copy(user):
            copy = user
            continue
        users.append(user)
    if copy is not None:
        src = copy.args[1] if len(copy.args) > 1 else None
        if getattr(src, "target", None) is operator.getitem:
            users.extend(u for u in src.users if u is not copy)
        users.extend(copy.users)
    if result is not None and result.target is operator.getitem:
        users.extend(result.users)
    return users


def _one_stream(users) -> bool:
    """``verify_nodes_on_same_stream``: fewer than two users, or all on one label."""
    return len(users) < 2 or len({_label(u) for u in users}) == 1


_RECORDS = {"npugraph_ex.tagged_event_record.default", "npugraph_ex.tagged_event_record_on_stream.default"}
_WAITS = {"npugraph_ex.tagged_event_wait.default", "npugraph_ex.tagged_event_wait_on_stream.default"}


def _event_protected(node, users) -> bool:
    """npugraph_ex's ``verify_cross_stream_event_protected``: users on another stream label than
    ``node`` are ordered after it (a record after it, waited before them) or before it (a record
    after them, waited before it), through chains of tagged events; positions are graph order."""
    stream = node.meta.get("stream_label")
    cross = [u for u in users if u.meta.get("stream_label") != stream]
    if not cross:
        return True
    position, records, waits = {}, {}, {}
    for pos, n in enumerate(node.graph.nodes):
        position[n] = pos
        target = str(n.target)
        if n.args and target in _RECORDS:
            records.setdefault(n.args[0], []).append((n.meta.get("stream_label"), pos))
        elif n.args and target in _WAITS:
            waits.setdefault(n.args[0], []).append((n.meta.get("stream_label"), pos))
    if not records or not waits:
        return False
    after = _closure(records, waits, {stream: position[node]}, forward=True)
    before = _closure(waits, records, {stream: position[node]}, forward=False)
    for user in cross:
        label, pos = user.meta.get("stream_label"), position[user]
        if not (label in after and pos > after[label] or label in before and pos < before[label]):
            return False
    return True


def _closure(sources, sinks, reached: dict, forward: bool) -> dict:
    """Per stream, the position past which (forward) or before which (backward) nodes are ordered
    with the in-place node, propagated through record -> wait pairs of one tag until nothing changes."""
    changed = True
    while changed:
        changed = False
        for tag, items in sources.items():
            for label, pos in items:
                if label not in reached or (pos <= reached[label] if forward else pos >= reached[label]):
                    continue
                for other, other_pos in sinks.get(tag, ()):
                    bound = other_pos if forward else other_pos + 1
                    if other not in reached or (bound < reached[other] if forward else bound > reached[other]):
                        reached[other] = bound
                        changed = True
    return reached


def _result(node, index: int, multi: bool):
    """The node holding the op's new value of mutated arg ``index``: the node itself, or for a
    multi-inplace op the ``getitem`` of its output (the new values come last, in arg order)."""
    if not multi:
        return node
    mutated = MULTI_INPLACE[node.target.overloadpacket.__name__][1]
    outputs = node.meta.get("val")
    position = len(outputs) - len(mutated) + mutated.index(index) if isinstance(outputs, (tuple, list)) else -1
    return next((u for u in node.users if u.target is operator.getitem and u.args[1] == position), None)


class _Graph:
    """What the checks need of one FX graph: order, aliases by storage, copy_ epilogues."""

    def __init__(self, gm):
        self.nodes = list(gm.graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self.aliases: dict = {}
        for n in self.nodes:
            storage = _storage(n)
            if storage is not None:
                self.aliases.setdefault(storage, []).append(n)
        self.inputs = {_storage(n) for n in self.nodes if n.op in ("placeholder", "get_attr")} - {None}
        self.copies = {(n.args[0], n.args[1]): n for n in self.nodes
                       if _is_copy(n) and getattr(n.args[0], "op", None) == "placeholder"}

    def read_later(self, base, node) -> bool:
        """Torch's ``_get_all_later_node_usages``: an alias of ``base`` used after ``node`` other than
        by a view or getitem of it and other than by its ``copy_`` epilogue."""
        aliases = self.aliases.get(_storage(base), [base])
        alias_set = set(aliases)
        for alias in aliases:
            for user in alias.users:
                if self.order[user] <= self.order[node] or _is_copy(user) and user.args[0] is base:
                    continue
                if user in alias_set and (isinstance(user.target, torch._ops.OpOverload)
                                          or user.target is operator.getitem):
                    continue
                return True
        return False

    def can_update(self, base, node) -> bool:
        """The input-mutated pass's ``can_inplace``: a graph input needs its ``copy_`` epilogue; an
        intermediate must not alias a graph input; no alias of it may be read after ``node``."""
        if base.op in ("placeholder", "get_attr"):
            if not any(_is_copy(u) and u.args[0] is base for u in base.users):
                return False
        elif _storage(base) in self.inputs:
            return False
        return not self.read_later(base, node)



def _candidate(graph: _Graph, node):
    """(pass switch, in-place op, mutated bases, their result nodes, copy_ nodes to fold) when
    TorchAir's passes would consider ``node`` whatever the streams, else None."""
    found = _inplace_op(node)
    if found is None or found[0] is None:
        return None
    inplace, indices = found
    multi = node.target.overloadpacket.__name__ in MULTI_INPLACE
    if any(i >= len(node.args) or not isinstance(node.args[i], torch.fx.Node) for i in indices):
        return None
    bases = [node.args[i] for i in indices]
    results = [_result(node, i, multi) for i in indices]
    copies = [graph.copies[(b, r)] for b, r in zip(bases, results) if (b, r) in graph.copies]
    if copies:
        if len(copies) != len(bases):
            return None             # "all mutated args(get_item) must have copy epilogues"
        switch = INPUT_MUTATED
    elif any(_storage(b) in graph.inputs or _storage(b) is None for b in bases):
        return None                 # step 1b: never mutate a program input without its copy_
    else:
        switch = INPLACEABLE
    if not multi:
        a, b = node.meta.get("val"), bases[0].meta.get("val")
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() == b.numel()
                and a.dtype == b.dtype and torch._debug_has_internal_overlap(b) != 1):
            return None             # step 1a: metadata
        if sum(arg is bases[0] for arg in node.args) > 1:
            return None             # step 1c: repeated self
    if not multi or switch == INPUT_MUTATED:
        if any(graph.read_later(base, node) for base in bases):
            return None             # step 2 / can_inplace
    return switch, inplace, bases, results, copies


def apply(gm, settings, graph_name: str) -> list:
    """Run both passes on ``gm`` as TorchAir would, in place; returns ``(node, Verdict)`` per candidate."""
    fxgraph.stream_labels(gm)
    disabled = {INPLACEABLE: settings.disable_inplaceable_pass, INPUT_MUTATED: settings.disable_input_mutated_pass}
    check = _event_protected if settings.backend == "npugraph_ex" else (lambda node, users: _one_stream(users))
    graph = _Graph(gm)
    verdicts, rewrites = [], []

    def checked(node, users_per_base, bases, kind) -> bool:
        for users, base in zip(users_per_base, bases):
            safe = check(node, users)
            if settings.backend == "npugraph_ex":
                _log_stream_check(node, users, base, kind, safe)
            if not safe:
                return False
        return True

    def verdict_of(node, name, op, inplace_op, switch, users_per_base, bases, kind) -> bool:
        users = list(dict.fromkeys(u for users in users_per_base for u in users))
        if disabled[switch]:
            verdict = "disabled"
        elif checked(node, users_per_base, bases, kind):
            verdict = "applied"
        else:
            verdict = "vetoed"
        verdicts.append((node, Verdict(
            graph_name, name, op, inplace_op, verdict, "input-mutated" if switch == INPUT_MUTATED else "inplaceable",
            switch, tuple(dict.fromkeys(_label(u) for u in users)),
            tuple((u.name, _label(u), fxgraph.node_site(u)) for u in users))))
        return verdict == "applied"

    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in _auto_functionalized():
            _auto_functionalized_bases(graph, node, verdict_of)
            continue
        found = _candidate(graph, node)
        if found is None:
            continue
        switch, inplace, bases, results, copies = found
        users = [_users(b, r if r is not node else None) for b, r in zip(bases, results)]
        kind = "multi_stream_single_reinplace" if len(bases) == 1 else "multi_stream_multi_reinplace"
        if verdict_of(node, node.name, node.target.name(), inplace.name(), switch, users, bases, kind):
            rewrites.append((node, inplace, bases, results, copies))
    for node, inplace, bases, results, copies in rewrites:
        _rewrite(gm, node, inplace, bases, results, copies)
    if not disabled[INPUT_MUTATED] and any(n.target in _auto_functionalized() for n in graph.nodes):
        from torch._inductor.fx_passes.post_grad import decompose_auto_functionalized

        decompose_auto_functionalized(gm.graph)   # TorchAir: right after the input-mutated pass
    gm.graph.lint()
    return verdicts


def _log_stream_check(node, users, base, kind: str, safe: bool) -> None:
    """npugraph_ex's DEBUG line for each stream check of a reinplace candidate (its tests read them)."""
    arg = f"{base.name}(storage={_storage(base)})" if isinstance(base, torch.fx.Node) else f"{base!r}(storage=None)"
    log = logging.getLogger("npugraph_ex")     # looked up now: the npugraph_ex shim installs its own logger
    if safe:
        log.debug("[%s]Current node: %s, type: %s, potential mutated arg: %s check stream safety success for "
                      "reinplace. Between the potential inplace node and user nodes, there is either no cross-stream "
                      "dependency, or any cross-stream dependency is protected by events. All the users are %s.",
                      kind, node.name, node.target, arg, users)
    else:
        log.debug("[%s]Current node: %s, type: %s, potential mutated arg: %s check stream safety failed for "
                      "reinplace. Between the potential inplace node and user nodes, a cross-stream dependency "
                      "exists without event protection. All the users are %s.", kind, node.name, node.target, arg,
                      users)


def _auto_functionalized() -> tuple:
    higher_order = torch.ops.higher_order
    return tuple(getattr(higher_order, name) for name in ("auto_functionalized", "auto_functionalized_v2")
                 if hasattr(higher_order, name))


def _auto_functionalized_bases(graph: _Graph, node, verdict_of) -> None:
    """The input-mutated pass on an ``auto_functionalized(_v2)`` node (a custom op with mutable
    arguments): each base it may update in place (``can_inplace`` and the stream check on that base's
    users) is not cloned; ``node.meta["only_clone_these_tensors"]`` tells the decomposition."""
    op = node.args[0]
    if node.target.__name__ == "auto_functionalized_v2":
        bases = list(enumerate(node.kwargs["_all_bases"]))
    else:
        from torch._higher_order_ops.auto_functionalize import get_mutable_args

        bases = [(name, node.kwargs[name]) for name in get_mutable_args(op)[0] if node.kwargs.get(name) is not None]
    clone, done = [], set()
    for key, base in bases:
        storage = _storage(base) if isinstance(base, torch.fx.Node) else None
        if storage is None or storage in done or not graph.can_update(base, node):
            clone.append(key)
            continue
        name = f"{node.name}[{base.name}]"
        if verdict_of(node, name, f"{node.target.__name__}({op.name()})", op.name(), INPUT_MUTATED, [_users(base)],
                      [base], "multi_stream_auto_functionalize"):
            done.add(storage)
        else:
            clone.append(key)
    node.meta["only_clone_these_tensors"] = clone


def _rewrite(gm, node, inplace, bases, results, copies) -> None:
    """``b = op(a, ...)`` -> ``op_(a, ...)``: later uses of ``b`` (and the ``copy_`` epilogues that
    wrote it back into ``a``) now read ``a``."""
    node.target = inplace
    for copy in copies:
        copy.replace_all_uses_with(copy.args[0])
        gm.graph.erase_node(copy)
    for base, result in zip(bases, results):
        if result is not None and result is not node:
            result.replace_all_uses_with(base)
            gm.graph.erase_node(result)
    if len(inplace._schema.returns) == 1:   # a multi op's in-place twin returns its first output alone
        for user in list(node.users):
            if user.target is operator.getitem and user.args[1] == 0:
                user.replace_all_uses_with(node)
                gm.graph.erase_node(user)
