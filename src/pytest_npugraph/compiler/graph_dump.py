"""``config.debug.graph_dump``: the compiled graph written as TorchAir names it
(``dynamo_original_graph_<n>_rank_<r>_pid_<p>_ts_<t>.<type>``, ``dynamo_optimized_graph_<n>...``), into
a folder that is made when missing (TorchAir's PathManager makes it too).  The real GE dump is the GE
graph (txt: its proto as text, pbtxt: TensorBoard nodes, py: GE Python code); the emulated graph is the
FX graph that runs, so the dump lists its nodes with their op, inputs, output shapes and the stream
each runs on ("main" or the ``npu_stream_switch`` tag; aclgraph: the label of its stream scope)."""
from __future__ import annotations

import os

from . import fxgraph


def _meta(node) -> str:
    val = node.meta.get("val")
    if hasattr(val, "shape") and hasattr(val, "dtype"):
        return f"{str(val.dtype).replace('torch.', '')}{list(val.shape)}"
    if isinstance(val, (list, tuple)):
        return ", ".join(f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}" for v in val if hasattr(v, "shape"))
    return ""


def _ops(gm, lanes, kinds=None):
    """(name, op, inputs, outputs, stream) of each node; ``lanes``: node -> stream tag (GE's plan),
    else the stream scopes in the graph or the nodes' stream labels."""
    if lanes is None:
        lanes = {node: scope.stream or node.meta.get("stream_label") for node, scope in fxgraph.scopes(gm).items()}
    for node in gm.graph.nodes:
        if node.op == "output":
            op = "NetOutput"
        elif node.op == "placeholder":
            op = (kinds or {}).get(node, "Data")
        elif node.op == "get_attr":
            op = "Const"
        else:
            op = fxgraph.target_name(node)
        lane = lanes.get(node)
        yield node.name, op, [n.name for n in node.all_input_nodes], _meta(node), "main" if lane is None else lane


# the two text forms: (block, op key, input suffix, stream attr, output line) -- GE's graph text and
# TensorBoard's pbtxt
_TXT = ("op", "type", ":0", "_user_stream_label", '  output_desc {{ tensor: "{}" }}')
_PBTXT = ("node", "op", "", "stream", '  attr {{ key: "_output_shapes" value {{ s: "{}" }} }}')


def _nodes(gm, lanes, form, kinds=None, head=()) -> str:
    block, op_key, suffix, stream_key, output_line = form
    lines = list(head)
    for node, op, inputs, outputs, stream in _ops(gm, lanes, kinds):
        lines += [f"{block} {{", f'  name: "{node}"', f'  {op_key}: "{op}"']
        lines += [f'  input: "{i}{suffix}"' for i in inputs]
        lines.append(f'  attr {{ key: "{stream_key}" value {{ s: "{stream}" }} }}')
        if outputs:
            lines.append(output_line.format(outputs))
        lines.append("}")
    return "\n".join(lines) + "\n"


def _txt(gm, name, lanes) -> str:
    return _nodes(gm, lanes, _TXT, head=[f'name: "{name}"'])


def _pbtxt(gm, name, lanes) -> str:
    return pbtxt(gm, lanes)


def pbtxt(gm, lanes, kinds=None) -> str:
    """TensorBoard-style nodes; ``kinds``: placeholder -> op ("Const" for a weight, "Shape" for a size)."""
    return _nodes(gm, lanes, _PBTXT, kinds)


def _py(gm, name, lanes) -> str:
    streams = [f"#   {node} ({op}): stream {stream}" for node, op, _, _, stream in _ops(gm, lanes)
               if op not in ("Data", "NetOutput", "Const")]
    return f"# {name}: the nodes and their streams\n" + "\n".join(streams) + "\n" + gm.code


def write(path: str, gm, kind: str, name: str, lanes=None) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.islink(folder):
        raise RuntimeError(f"Failed to make directory: {folder}")
    os.makedirs(folder, mode=0o750, exist_ok=True)
    text = {"txt": _txt, "pbtxt": _pbtxt, "py": _py}[kind](gm, name, lanes)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
