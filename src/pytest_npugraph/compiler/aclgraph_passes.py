"""TorchAir's reduce-overhead FX passes that shape what a capture contains (reference §1.4, §2.3):

* ``apply_event_closure_with_multi_stream``: every stream scope is forked from the capture stream at
  graph start and joined back before the output (tagged events ``<graph>_<node>``, created inside);
* ``apply_event_record``: each ``air.wait`` gets an ``air.record`` after every producer it waits for;
* ``replace_core_limit_nodes``: ``limit_core_num`` scopes become ``set_stream_limit`` calls on the
  current stream, restored on exit; a stream scope nested in one inherits its limit.
"""
from __future__ import annotations

import operator
import warnings

import torch

from ..runtime.runtime import current
from . import fxgraph
from .events import create_internal_event

_CORE_KEYS = {"_op_aicore_num", "_op_vectorcore_num"}
_SWITCH_KEYS = {"_user_stream_label", "_user_stream_priority"}


def apply_event_closure_with_multi_stream(gm, graph_name: str, tagged_event_names: list, user_stream_label: set,
                                          user_stream_info: dict = None, namespace: str = "air"):
    """Returns ``(multi_stream_enabled, {enter node name: label}, [exit node names])``.

    Scopes of native streams (``_user_stream_id`` in the keys, from ``replace_stream_event_pass``):
    one record at graph start, each unique user stream waits for it (``tagged_event_wait_on_stream``)
    and is joined before the output (``tagged_event_record_on_stream`` + ``tagged_event_wait`` of
    ``<graph>_stream_id_<id>_device_index_<i>_device_type_<t>``).  Scopes with a label only
    (``npu_stream_switch``, custom passes): a wait after each enter, a record before each exit and
    its wait before the output."""
    user_stream_info = {} if user_stream_info is None else user_stream_info
    ops = getattr(torch.ops, namespace)
    enters, exits, enter_labels, exit_names, stack = [], [], {}, [], []
    for node in gm.graph.nodes:
        name = fxgraph.target_name(node)
        if name == fxgraph.SCOPE_ENTER:
            node.kwargs = {**node.kwargs, "need_execute": True}
            if node.args and fxgraph.STREAM_LABEL in node.args[0]:
                attrs = dict(zip(node.args[0], node.args[1]))
                label = attrs[fxgraph.STREAM_LABEL]
                user_stream_label.add(label)
                enter_labels[node.name] = label
                if "_user_stream_id" in attrs:
                    user_stream_info[label] = {"stream_id": int(attrs["_user_stream_id"]),
                                               "device_index": int(attrs["_user_stream_device_index"]),
                                               "device_type": int(attrs["_user_stream_device_type"])}
                else:
                    enters.append(node)
            stack.append(node)
        elif name == fxgraph.SCOPE_EXIT:
            node.kwargs = {**node.kwargs, "need_execute": True}
            if stack and stack[-1].args and fxgraph.STREAM_LABEL in stack[-1].args[0]:
                exit_names.append(node.name)
                if "_user_stream_id" not in stack[-1].args[0]:
                    exits.append(node)
            stack.pop()
    if not enters and not user_stream_info:
        return False, enter_labels, exit_names
    output = list(gm.graph.nodes)[-1]
    if output is None or output.op != "output":
        raise RuntimeError(f"Graph must have output node as last node, but got {output}")
    first = next(iter(gm.graph.nodes))
    enter_tag = f"{graph_name}_{first.name}"
    tagged_event_names.append(enter_tag)
    with gm.graph.inserting_before(first):
        fork = gm.graph.call_function(ops.tagged_event_record.default, args=(enter_tag, True))
    streams = list({(d["stream_id"], d["device_index"], d["device_type"]): d
                    for d in user_stream_info.values()}.values())
    for info in streams:
        ids = (str(info["stream_id"]), str(info["device_index"]), str(info["device_type"]))
        with gm.graph.inserting_after(fork):
            gm.graph.call_function(ops.tagged_event_wait_on_stream.default, args=(enter_tag, *ids, True))
        exit_tag = f"{graph_name}_stream_id_{ids[0]}_device_index_{ids[1]}_device_type_{ids[2]}"
        tagged_event_names.append(exit_tag)
        with gm.graph.inserting_before(output):
            gm.graph.call_function(ops.tagged_event_record_on_stream.default, args=(exit_tag, *ids, True))
            gm.graph.call_function(ops.tagged_event_wait.default, args=(exit_tag, True))
    for node in enters:
        with gm.graph.inserting_after(node):
            gm.graph.call_function(ops.tagged_event_wait.default, args=(enter_tag, True))
    for node in exits:
        exit_tag = f"{graph_name}_{node.name}"
        tagged_event_names.append(exit_tag)
        with gm.graph.inserting_before(node):
            gm.graph.call_function(ops.tagged_event_record.default, args=(exit_tag, True))
        with gm.graph.inserting_before(output):
            gm.graph.call_function(ops.tagged_event_wait.default, args=(exit_tag, True))
    gm.graph.lint()
    return bool(user_stream_info), enter_labels, exit_names


def create_events(tagged_event_names) -> None:
    """The internal events of a graph, in this test (TorchAir: on the generated module's first run)."""
    for tag in tagged_event_names:
        create_internal_event(tag)


def apply_event_record(gm) -> None:
    recorded: dict = {}
    for node in gm.graph.nodes:
        if fxgraph.target_name(node) != "air.wait.default":
            continue
        new_args = []
        for waited in node.args[0]:
            if fxgraph.target_name(waited) == "air.record.default":
                new_args.append(waited)
            elif waited in recorded:
                new_args.append(recorded[waited])
            else:
                with gm.graph.inserting_after(waited):
                    recorded[waited] = gm.graph.call_function(
                        getattr(torch.ops, str(node.target).split(".")[0]).record.default, args=())
                new_args.append(recorded[waited])
        node.args = (new_args,)
    gm.graph.lint()


def replace_core_limit_nodes(gm, settings) -> bool:
    """Rewrites the core-limit scopes; returns whether static shape kernels stay on (TorchAir turns them
    off, with a warning, when a graph has a core limit and CANN is older than 9.0.0)."""
    scopes, limits = [], []     # kind per open scope; [stream node, saved cube, saved vector, cube, vector]
    enabled = False
    for node in list(gm.graph.nodes):
        name = fxgraph.target_name(node)
        if name == fxgraph.SCOPE_ENTER:
            _enter(gm, node, scopes, limits)
        elif name == fxgraph.SCOPE_EXIT:
            _exit(gm, node, scopes, limits)
        enabled = enabled or bool(limits)
    if enabled and settings.static_kernel and not settings.cann_ge_9:
        warnings.warn("When both static shape kernel and core limit are enabled, only core limit will take "
                      "effect, static shape kernel will be disabled. CANN 9.0.0 or later supports enabling "
                      "both features.")
        return False
    return settings.static_kernel


def _enter(gm, node, scopes, limits) -> None:
    keys = set(node.args[0])
    if _CORE_KEYS <= keys:
        cube, vector = node.args[1][node.args[0].index("_op_aicore_num")], \
            node.args[1][node.args[0].index("_op_vectorcore_num")]
        with gm.graph.inserting_before(node):
            stream = gm.graph.call_function(torch.npu.current_stream)
            got = gm.graph.call_function(torch.npu.get_stream_limit, args=(stream,))
            saved_cube = gm.graph.call_function(operator.getitem, args=(got, "cube_core_num"))
            saved_vector = gm.graph.call_function(operator.getitem, args=(got, "vector_core_num"))
            setter = gm.graph.call_function(torch.npu.set_stream_limit, args=(stream, int(cube), int(vector)))
        node.replace_all_uses_with(setter)
        gm.graph.erase_node(node)
        limits.append([stream, saved_cube, saved_vector, cube, vector])
        scopes.append("core_limit")
    elif _SWITCH_KEYS <= keys and limits:
        cube, vector = limits[-1][3], limits[-1][4]
        with gm.graph.inserting_after(node):
            stream = gm.graph.call_function(torch.npu.current_stream)
        with gm.graph.inserting_after(stream):
            got = gm.graph.call_function(torch.npu.get_stream_limit, args=(stream,))
        with gm.graph.inserting_after(got):
            gm.graph.call_function(torch.npu.set_stream_limit, args=(stream, int(cube), int(vector)))
            saved_vector = gm.graph.call_function(operator.getitem, args=(got, "vector_core_num"))
            saved_cube = gm.graph.call_function(operator.getitem, args=(got, "cube_core_num"))
        limits.append([stream, saved_cube, saved_vector, cube, vector])
        scopes.append("stream_switch")
    else:
        scopes.append("other")


def set_stream_limit_restore(stream, cube_num, vector_num) -> None:
    """TorchAir's ``set_stream_limit(stream, *saved)`` at a scope's end: what ``get_stream_limit`` read
    at its start, the device maximum when nobody had set a limit, which then is no limit again."""
    with current().restored_limits():
        torch.npu.set_stream_limit(stream, cube_num, vector_num)


def _exit(gm, node, scopes, limits) -> None:
    kind = scopes.pop()
    if kind == "other":
        return
    stream, saved_cube, saved_vector, _, _ = limits.pop()
    with gm.graph.inserting_after(node):
        restore = gm.graph.call_function(set_stream_limit_restore, args=(stream, saved_cube, saved_vector))
    if kind == "core_limit":
        node.replace_all_uses_with(restore)
        gm.graph.erase_node(node)
