"""Native ``torch.npu.Stream``/``Event`` code in a compiled region -> the graph's stream scopes and
tagged events: TorchAir's ``replace_stream_event_pass`` (reference torchair_api.md §2.6-2.7), run on
the Dynamo graph before AOTAutograd in the aclgraph modes, and ``resolve_default_stream_markers``.

What Dynamo (with torch_npu's patch) leaves in the graph, and what it becomes:

* an event object (made outside or inside the region; ``get_external_object_by_index``): a TorchAir
  event registered under the tag ``<graph_id><node name>`` (the user's object itself is not used); an
  event ``stream.record_event()`` makes is tagged ``<graph_id><record_event node name>`` (Dynamo puts
  its object's node after the record; TorchAir names it after the call);
* ``event.record()`` / ``stream.record_event(event)`` (``streams.record_event``):
  ``npugraph_ex.tagged_event_record(tag, True)`` on the graph's stream, else
  ``tagged_event_record_on_stream(tag, id, index, type, True)``; ``event.wait()`` /
  ``stream.wait_event(event)`` likewise with ``tagged_event_wait``;
* ``s.wait_stream(other)`` (``streams.wait_stream``): ``tagged_stream_wait_stream`` (6 strings);
* ``tensor.record_stream(s)`` (``streams.record_stream``): ``record_tagged_on_stream_(t, id, index,
  type)``, a tagged record the reinplace checker and the allocator honour;
* ``torch.npu.set_stream(s)`` (``with torch.npu.stream(s)`` enters and leaves with it): a stack.  A
  new stream not on the stack is pushed as ``scope_enter(["_user_stream_label", ...], [<graph_id><node>,
  "0", id, index, type])``; a stream on the stack pops (``scope_exit``) down to it; the graph's own
  stream pops everything; anything else is TorchAir's ``RuntimeError``; a non-empty stack at the end is
  the "set stream to the same stream as the begin" ``RuntimeError``.

The graph's own stream (the stream current when the graph is compiled, Dynamo's index 0) is written
as the ``DEFAULT_*_MARKER`` strings; ``resolve_default_stream_markers`` replaces them by the stream
current when the graph runs (the capture stream)."""
from __future__ import annotations

import itertools
import logging

import torch

from . import events

log = logging.getLogger("torchair")

DEFAULT_STREAM_ID_MARKER = "DEFAULT_STREAM_ID_MARKER"
DEFAULT_DEVICE_INDEX_MARKER = "DEFAULT_DEVICE_INDEX_MARKER"
DEFAULT_DEVICE_TYPE_MARKER = "DEFAULT_DEVICE_TYPE_MARKER"
MARKERS = (DEFAULT_STREAM_ID_MARKER, DEFAULT_DEVICE_INDEX_MARKER, DEFAULT_DEVICE_TYPE_MARKER)
USER_STREAM_KEYS = ["_user_stream_label", "_user_stream_priority", "_user_stream_id", "_user_stream_device_index",
                    "_user_stream_device_type"]
_DEFAULT = "default_stream"
_END_ERROR = ("When use npugraph_ex, you must make sure at the end of your code set stream to the same stream as the "
              "begin of your code.\nE.g: at the begin of your code, call 'enter_stream = torch.npu.current_stream()', "
              "and at the end of your code, call 'torch.npu.set_stream(enter_stream)'. \nA more recommended way is "
              "to use 'with torch.npu.stream()' instead of 'torch.npu.set_stream()'")


def next_graph_id(rt) -> str:
    """``GraphCounter.graph_id()``: "graph_<n>_", counted from 0 per test (a fresh machine per test)."""
    counter = rt.extensions.setdefault("compiler.stream_event_graph_ids", itertools.count())
    return f"graph_{next(counter)}_"


def _external(node):
    """The object behind a ``get_external_object_by_index`` node, else None."""
    from torch._dynamo import graph_bytecode_inputs as inputs

    if node.op != "call_function" or node.target is not inputs.get_external_object_by_index:
        return None
    return node.meta.get("example_value")


def _is_stream_object(value) -> bool:
    return isinstance(value, torch.Stream)      # Dynamo's current stream is a plain torch.Stream


def _is_event_object(value) -> bool:
    return isinstance(value, torch.Event)


def _stream_fields(stream, default_id) -> tuple:
    if stream is None or stream.stream_id == default_id:
        return MARKERS
    return str(stream.stream_id), str(stream.device_index), str(stream.device_type)


def _entry_stream_id(inputs):
    """The stream current when Dynamo started tracing (its index 0); tracing itself may have run the
    region's ``set_stream`` calls already."""
    try:
        return inputs.get_external_object_by_index(inputs.CURRENT_STREAM_INDEX).stream_id
    except (AssertionError, AttributeError):
        return torch.npu.current_stream().stream_id


def _stream_of_index(index):
    from torch._dynamo import graph_bytecode_inputs as inputs

    return inputs.get_external_object_by_index(index)


def replace_stream_event_pass(gm, scope_namespace: str, graph_id: str, created_tags: list = None):
    """Rewrite ``gm`` (a Dynamo graph) in place; returns it.  ``scope_namespace``: "air" (torchair) or
    "npugraph_ex" (the backend) for the stream scopes; events always use the ``npugraph_ex`` ops, as
    TorchAir does with this torch version.  The tags of the events it registers go to ``created_tags``."""
    streams_ops = getattr(torch.ops, "streams", None)
    if streams_ops is None or not hasattr(streams_ops, "record_event"):
        return gm
    from torch._dynamo import graph_bytecode_inputs as inputs

    ex = torch.ops.npugraph_ex
    scopes = getattr(torch.ops, scope_namespace)
    graph = gm.graph
    default_id = _entry_stream_id(inputs)
    created_tags = [] if created_tags is None else created_tags
    event_tags: dict = {}          # external object index -> tag
    stream_nodes: dict = {}        # stream node -> the torch.npu.Stream
    current_alias: dict = {}       # current_stream() node -> the logical stream it stood for
    stack: list = []
    current = _DEFAULT
    changed = False

    def stream_at(index):
        return _stream_of_index(index) if index is not None else None

    record_ops = (streams_ops.record_event.default, streams_ops.record_event)
    for node in graph.nodes:     # every event first: Dynamo puts a made event after its record_event
        value = _external(node)
        if value is not None and _is_event_object(value):
            tag = graph_id + node.name
        elif node.op == "call_function" and node.target in record_ops:
            tag = graph_id + node.name             # s.record_event() made it: named after the call, as TorchAir
        else:
            continue
        if node.args[0] not in event_tags:
            event_tags[node.args[0]] = tag
            events.create_internal_event(tag)
            created_tags.append(tag)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        value = _external(node)
        if value is not None and _is_event_object(value):
            continue
        elif value is not None and _is_stream_object(value):
            if node.args[0] == inputs.CURRENT_STREAM_INDEX:
                current_alias[node] = _DEFAULT
            stream_nodes[node] = value
        elif target is torch.npu.current_stream:
            stream_nodes[node] = node.meta.get("example_value")
            current_alias[node] = current
        elif target in (streams_ops.record_event.default, streams_ops.record_event,
                        streams_ops.wait_event.default, streams_ops.wait_event):
            record = target in (streams_ops.record_event.default, streams_ops.record_event)
            tag = event_tags.get(node.args[0])
            if tag is None:
                tag = event_tags[node.args[0]] = graph_id + node.name
                events.create_internal_event(tag)
                created_tags.append(tag)
            stream = stream_at(node.args[1]) if len(node.args) > 1 else None
            fields = _stream_fields(stream, default_id)
            if fields == MARKERS:
                node.target = ex.tagged_event_record.default if record else ex.tagged_event_wait.default
                node.args = (tag, True)
            else:
                node.target = (ex.tagged_event_record_on_stream.default if record
                               else ex.tagged_event_wait_on_stream.default)
                node.args = (tag, *fields, True)
            changed = True
        elif target in (streams_ops.wait_stream.default, streams_ops.wait_stream):
            waiting, waited = (_stream_fields(stream_at(i), default_id) for i in node.args[:2])
            node.target = ex.tagged_stream_wait_stream.default
            node.args = (*waiting, *waited)
            changed = True
        elif hasattr(streams_ops, "record_stream") and target in (streams_ops.record_stream.default,
                                                                  streams_ops.record_stream):
            node.target = ex.record_tagged_on_stream_.default
            node.args = (node.args[0], *_stream_fields(stream_at(node.args[1]), default_id))
            changed = True
        elif target is torch.npu.set_stream:
            wanted = node.args[0]
            wanted = current_alias.get(wanted, wanted)
            current = wanted
            changed = True
            if wanted != _DEFAULT and wanted not in stack and wanted in stream_nodes:
                stream = stream_nodes[wanted]
                node.target = scopes.scope_enter.default
                node.args = (list(USER_STREAM_KEYS), [graph_id + wanted.name, "0",
                                                      *_stream_fields(stream, default_id)])
                stack.append(wanted)
            elif wanted in stack:
                _pop_to(graph, node, stack, lambda: stack[-1] == wanted, scopes)
            elif wanted == _DEFAULT:
                _pop_to(graph, node, stack, lambda: not stack, scopes)
            else:
                raise RuntimeError(f"Can not find stream: {getattr(wanted, 'name', wanted)} in FX graph when parse "
                                   f"torch.npu.set_stream.Please submit a issue to TorchAir")
    if stack:
        log.error("there is some stream not pop from stack: %s", stack)
        raise RuntimeError(_END_ERROR)
    if changed:
        graph.lint()
        gm.recompile()
    return gm


def _pop_to(graph, node, stack, done, scopes) -> None:
    """``set_stream`` back to a stream lower on the stack: a ``scope_exit`` per popped stream, each put
    right after the ``set_stream`` node, which stays (as TorchAir leaves it: the graph's nodes, their
    names and positions are what its tests read)."""
    while not done():
        stack.pop()
        with graph.inserting_after(node):     # named as TorchAir's (it writes the op packet): scope_exit, _1, ...
            graph.create_node("call_function", scopes.scope_exit.default, args=(), name="scope_exit")


_MARKER_TARGETS = ("tagged_event_record_on_stream", "tagged_event_wait_on_stream", "tagged_stream_wait_stream",
                   "scope_enter")


def resolve_default_stream_markers(gm) -> None:
    """Replace the default-stream markers by the fields of ``torch.npu.current_stream()`` taken at the
    top of the graph (the stream the graph runs on: the capture stream)."""
    users = [n for n in gm.graph.nodes if n.op == "call_function" and
             getattr(getattr(n.target, "overloadpacket", None), "__name__", "") in _MARKER_TARGETS and
             any(MARKERS[0] == a or (isinstance(a, (list, tuple)) and MARKERS[0] in a) for a in n.args)]
    if not users:
        return
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first):
        stream = gm.graph.call_function(torch.npu.current_stream)
        fields = {}
        for marker, attr in zip(MARKERS, ("stream_id", "device_index", "device_type")):
            got = gm.graph.call_function(getattr, args=(stream, attr))
            fields[marker] = gm.graph.call_function(str, args=(got,))

    def resolve(arg):
        if isinstance(arg, str) and arg in fields:
            return fields[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(resolve(a) for a in arg)
        return arg

    for node in users:
        node.args = tuple(resolve(a) for a in node.args)
    gm.graph.lint()
    gm.recompile()
