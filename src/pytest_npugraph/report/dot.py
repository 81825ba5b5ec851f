"""DOT pictures of compiled graphs: the stream of every op, and the edges that order them.

Two sources, one picture (a ``networkx.DiGraph`` serialised as Graphviz DOT, a cluster per stream):

* ``graph_of(record)``: an ``npugraph.graphs[i]`` record, from the FX graph the mode runs: each
  stream's ops in issue order, data edges, ``npu_wait_tensor`` control edges, tagged-event
  record -> wait edges (TorchAir's own fork/join events included); a data edge between two
  streams is drawn in orange.
* ``replay_graph(trace, label)``: what the device ran for one graph call, from the trace (kernels
  whose ``graph`` label contains ``label``, e.g. ``"decode_step#replay2"``; or the
  tasks in a seq range): stream order, event record -> wait edges (in GE mode the compiler's own
  events exist only here), and read-after-write edges through memory.

``to_dot(record_or_graph)`` renders either.  networkx is imported here only, lazily.
"""
from __future__ import annotations

import networkx as nx

from .. import trace as T

MAIN = "main"                                   # the graph's main (capture) stream in FX pictures
SKIPPED = ("air.scope_enter", "air.scope_exit")  # scope brackets: shown as clusters, not nodes
EDGE_STYLE = {
    "data": 'color="#475467"',
    "cross": 'color="#f79009", penwidth=1.6',
    "control": 'style=dotted, color="#6941c6", penwidth=1.4',
    "event": 'style=dashed, color="#d92d20", penwidth=1.4',
    "stream": 'color="#98a2b3", arrowhead=none',
}
NODE_STYLE = {
    "input": 'shape=ellipse, fillcolor="#f2f4f7"',
    "output": 'shape=ellipse, fillcolor="#f2f4f7"',
    "op": 'fillcolor="#d1e9ff"',
    "event": 'shape=cds, fillcolor="#fee4e2"',
    "wait_tensor": 'shape=cds, fillcolor="#ebe9fe"',
}


# ------------------------------------------------------------------------ FX graphs
def graph_of(record) -> nx.DiGraph:
    """The ops of a compiled graph record with their streams and the edges between them."""
    g = nx.DiGraph(name=record.label, mode=record.mode)     # the name reports use (graph_names)
    streams = {op.name: op.stream or MAIN for op in record.ops}
    fx = getattr(record, "fx_graph", None)
    if fx is None:
        for op in record.ops:
            if not op.op.startswith(SKIPPED):
                g.add_node(op.name, label=op.op, stream=streams[op.name], kind="op")
        return g
    nodes = [n for n in fx.graph.nodes if not str(n.target).startswith(SKIPPED)]
    for n in nodes:
        g.add_node(n.name, label=_fx_label(n), stream=None if n.op in ("placeholder", "output") else
                   streams.get(n.name, n.meta.get("stream_label") or MAIN), kind=_fx_kind(n))
    kept = {n.name for n in nodes}
    for n in nodes:
        controls = {a.name for a in n.args[1:] if hasattr(a, "name")} if g.nodes[n.name]["kind"] == "wait_tensor" else set()
        for src in n.all_input_nodes:
            if src.name in kept:
                kind = "control" if src.name in controls else _data_kind(g, src.name, n.name)
                g.add_edge(src.name, n.name, kind=kind)
    _event_edges(g, [n for n in nodes if g.nodes[n.name]["kind"] == "event"])
    _stream_order(g, [n.name for n in nodes])
    return g


def _stream_order(g: nx.DiGraph, names: list) -> None:
    """Consecutive ops of one stream, in issue order (a stream runs its tasks in order)."""
    last: dict = {}
    for name in names:
        stream = g.nodes[name]["stream"]
        if stream is None:
            continue
        if stream in last and not g.has_edge(last[stream], name):
            g.add_edge(last[stream], name, kind="stream")
        last[stream] = name


def _fx_kind(n) -> str:
    target = str(n.target)
    if n.op in ("placeholder", "output"):
        return "input" if n.op == "placeholder" else "output"
    if "tagged_event_record" in target or "tagged_event_wait" in target:
        return "event"
    return "wait_tensor" if "wait_tensor" in target else "op"


def _fx_label(n) -> str:
    target = str(n.target)
    if "tagged_event" in target:
        verb = "record" if "record" in target else "wait"
        return f"{verb} {n.args[0]}"
    return n.name if n.op in ("placeholder", "output") else f"{n.name}\n{target}"


def _data_kind(g: nx.DiGraph, src: str, dst: str) -> str:
    a, b = g.nodes[src]["stream"], g.nodes[dst]["stream"]
    return "cross" if a is not None and b is not None and a != b else "data"


def _event_edges(g: nx.DiGraph, events: list) -> None:
    """record -> wait of the same tag: the latest record before the wait, else (a wait at graph start
    on an event recorded at its end: the previous replay) the last one."""
    records: dict = {}
    for n in events:
        if "record" in str(n.target):
            records.setdefault(str(n.args[0]), []).append(n)
    position = {n.name: i for i, n in enumerate(events)}
    for n in events:
        if "wait" not in str(n.target):
            continue
        candidates = records.get(str(n.args[0]), [])
        before = [r for r in candidates if position[r.name] < position[n.name]]
        source = (before or candidates[-1:] or [None])[-1]
        if source is not None:
            g.add_edge(source.name, n.name, kind="event")


# ------------------------------------------------------------------------ trace slices
def replay_graph(trace: T.Trace, label: str = None, seqs: range = None) -> nx.DiGraph:
    """The device tasks of one graph call (kernels whose ``graph`` contains ``label``, with the event
    records/waits among them) or of ``seqs``, ordered as the streams and events order them.  A data
    edge joins a writer to a later task touching its bytes (an in-place op lists its ``self`` only
    among its writes)."""
    tasks = _slice_tasks(trace, label, seqs)
    g = nx.DiGraph(name=label or f"seq {seqs.start}-{seqs.stop}", mode="trace")
    last_on_stream: dict = {}
    last_record: dict = {}
    writers: list = []
    for r in tasks:
        name = f"t{r.seq}"
        stream = trace.streams[r.stream].label
        if isinstance(r, T.Kernel):
            g.add_node(name, label=f"{r.op.split('::')[-1]}\n{r.site}", stream=stream, kind="op")
            for w, spans in writers:
                if any(s.overlaps(o) for s in r.reads + r.writes for o in spans):   # in-place: writes only
                    g.add_edge(w, name, kind="cross" if g.nodes[w]["stream"] != stream else "data")
            writers.append((name, r.writes))
        else:
            info = trace.events.get(r.event)
            verb = "record" if isinstance(r, T.EventRecord) else "wait"
            g.add_node(name, label=f"{verb} {info.label if info else r.event}", stream=stream, kind="event")
            if verb == "record":
                last_record[r.event] = name
            elif r.event in last_record:
                g.add_edge(last_record[r.event], name, kind="event")
        if r.stream in last_on_stream and not g.has_edge(last_on_stream[r.stream], name):
            g.add_edge(last_on_stream[r.stream], name, kind="stream")
        last_on_stream[r.stream] = name
    return g


def _slice_tasks(trace: T.Trace, label, seqs) -> list:
    device_tasks = (T.Kernel, T.EventRecord, T.EventWait)
    if seqs is None:
        hits = [r.seq for r in trace.records if isinstance(r, T.Kernel) and r.graph and label in str(r.graph)]
        if not hits:
            raise KeyError(f"no kernel of the trace belongs to a graph labelled like {label!r}")
        seqs = range(hits[0], hits[-1] + 1)
    streams = {r.stream for r in trace.records[seqs.start:seqs.stop] if isinstance(r, T.Kernel)
               and (label is None or (r.graph and label in str(r.graph)))}
    return [r for r in trace.records[seqs.start:seqs.stop] if isinstance(r, device_tasks) and r.stream in streams
            and (not isinstance(r, T.Kernel) or label is None or (r.graph and label in str(r.graph)))]


# ------------------------------------------------------------------------------ DOT
def to_dot(source) -> str:
    """Graphviz DOT of a graph record (``npugraph.graphs[i]``) or of a DiGraph from this module."""
    g = source if isinstance(source, nx.DiGraph) else graph_of(source)
    title = f"{g.graph.get('name', 'graph')} ({g.graph.get('mode', '?')})"
    lines = [f"digraph {_q(g.graph.get('name', 'graph'))} {{",
             f"  label={_q(title)}; labelloc=t; rankdir=TB; fontname=Helvetica;",
             '  node [shape=box, style="rounded,filled", fontname=monospace, fontsize=10];',
             "  edge [fontname=Helvetica, fontsize=9];"]
    clusters: dict = {}
    for name, attrs in g.nodes(data=True):
        clusters.setdefault(attrs.get("stream"), []).append(name)
    for i, (stream, names) in enumerate(sorted(clusters.items(), key=lambda kv: (kv[0] is not None, kv[0] != MAIN,
                                                                                 str(kv[0])))):
        indent = "  "
        if stream is not None:
            title = "main stream" if stream == MAIN else stream if "/" in stream else f"stream {stream!r}"
            lines.append(f"  subgraph cluster_{i} {{ label={_q(title)}; style=rounded; color=\"#98a2b3\";")
            indent = "    "
        for name in names:
            attrs = g.nodes[name]
            lines.append(f"{indent}{_q(name)} [label={_q(attrs.get('label', name))}, "
                         f"{NODE_STYLE.get(attrs.get('kind'), NODE_STYLE['op'])}];")
        if stream is not None:
            lines.append("  }")
    for a, b, attrs in g.edges(data=True):
        lines.append(f"  {_q(a)} -> {_q(b)} [{EDGE_STYLE.get(attrs.get('kind'), EDGE_STYLE['data'])}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _q(text) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
