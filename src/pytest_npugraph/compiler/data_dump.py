"""Data dump (``dump_config.enable_dump``; npugraph_ex ``dump_tensor_data``): the tensors of a
compiled graph written to files, where and as TorchAir names them.

* reduce-overhead / npugraph_ex: ``npu.save_npugraph_tensor(node, save_path=<dir>/<node>.pt)`` after
  every tensor node (one that is not saved already), so each run writes ``<node>_device_<i>_<n>.pt``
  (``torch.save``) in ``<dump_path>/worldsize<N>_global_rank<r>``; stage "optimized" inserts them into
  the graph that is captured, "original" into the AOT graph, which then runs eagerly (as TorchAir).
* GE (max-autotune): GE's layout ``<dump_path>/worldsize<N>_global_rank<r>/<YYYYmmddHHMMSS>/<device>/
  <graph name>/1/<iteration>/<OpType>.<OpName>.<task id>.<stream id>.<timestamp>``, for the ops that
  ``dump_layer`` names (GE op names: ``Add``, ``Add_1``, ...) and those under ``torchair.scope.data_dump()``
  (all ops when neither selects), on the iterations of ``dump_step``, with the inputs, outputs or both
  (``dump_mode``).  The real file is GE's binary dump (a protobuf header and the raw data); the
  emulator's holds the same tensors as ``torch.save({"input": [...], "output": [...]})``."""
from __future__ import annotations

import os
import re
import time
from datetime import datetime

import torch

from . import fxgraph

DUMP_SCOPE_KEY = "torchair_enable_data_dump"


def rank_dir(base: str) -> str:
    """``<base>/worldsize<N>_global_rank<r>`` (made if missing), as both packages name it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        sub = f"worldsize{dist.get_world_size()}_global_rank{dist.get_rank()}"
    else:
        sub = "worldsize1_global_rank0"
    path = os.path.join(base, sub)
    os.makedirs(path, exist_ok=True)
    return path


# ---------------------------------------------------------------------------- aclgraph
def insert_saves(gm, directory: str):
    """A ``save_npugraph_tensor`` after every tensor node of ``gm`` (TorchAir's insert_save_npugraph_tensor)."""
    save = torch.ops.npu.save_npugraph_tensor.default
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "output" or (node.op == "call_function" and node.target is save):
            continue
        if any(u.op == "call_function" and u.target is save for u in node.users):
            continue                       # the user saves it already
        if "tensor_meta" not in node.meta:
            continue
        with graph.inserting_after(node):
            graph.call_function(save, args=(node,), kwargs={"save_path": os.path.join(directory, f"{node.name}.pt")})
    gm.recompile()
    return gm


# ---------------------------------------------------------------------------------- GE
def _steps(spec: str):
    """The iterations ``dump_step`` ("0|2-5") names; None: every iteration."""
    if not spec:
        return None
    steps = set()
    for part in spec.split("|"):
        if not part:
            continue
        low, _, high = part.partition("-")
        steps.update(range(int(low), int(high or low) + 1))
    return steps


def _op_type(node) -> str:
    base = fxgraph.target_name(node).split(".")
    name = base[1] if len(base) > 1 and base[0] in ("aten", "npu", "air", "prims") else base[0]
    return "".join(part[:1].upper() + part[1:] for part in name.strip("_").split("_")) or "Op"


class GeDump:
    """What one GE graph dumps: the selected nodes and their GE names, and where its files go."""

    def __init__(self, gm, graph_name: str, settings):
        self.graph_name = graph_name
        self.base = settings.data_dump_path
        self.mode = settings.dump_mode
        self.steps = _steps(settings.dump_step or "")
        layers = set((settings.dump_layer or "").split())
        names, counts, in_scope, depth = {}, {}, set(), []
        for node in gm.graph.nodes:
            target = fxgraph.target_name(node)
            if target == fxgraph.SCOPE_ENTER:
                depth.append(DUMP_SCOPE_KEY in node.args[0])
                continue
            if target == fxgraph.SCOPE_EXIT:
                depth and depth.pop()
                continue
            if node.op != "call_function" or target == "<built-in function getitem>":
                continue
            kind = _op_type(node)
            n = counts.get(kind, 0)
            counts[kind] = n + 1
            names[node] = (kind, kind if n == 0 else f"{kind}_{n}")
            if any(depth):
                in_scope.add(node)
        selected = {node for node, (_, name) in names.items() if name in layers} | in_scope
        self.names = {node: names[node] for node in (selected or names)}
        self.run_dir = None

    def begin(self, iteration: int, device: int) -> bool:
        """Whether this run dumps (``dump_step``); makes its folder."""
        if self.steps is not None and iteration not in self.steps:
            self.run_dir = None
            return False
        from pytest_npugraph.runtime.runtime import current

        stamp = current().extensions.setdefault("torchair.data_dump_time", datetime.now().strftime("%Y%m%d%H%M%S"))
        self.run_dir = os.path.join(rank_dir(self.base), stamp, str(device), self.graph_name, "1", str(iteration))
        os.makedirs(self.run_dir, exist_ok=True)
        return True

    def node(self, node, args, kwargs, result, stream_id: int, task_id: int) -> None:
        if self.run_dir is None or node not in self.names:
            return
        kind, name = self.names[node]
        data = {}
        if self.mode in ("input", "all"):
            data["input"] = [_host(a) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if self.mode in ("output", "all"):
            outs = result if isinstance(result, (list, tuple)) else (result,)
            data["output"] = [_host(o) for o in outs if isinstance(o, torch.Tensor)]
        name = re.sub(r"[^0-9A-Za-z_]", "_", name)
        torch.save(data, os.path.join(self.run_dir, f"{kind}.{name}.{task_id}.{stream_id}.{time.time_ns() // 1000}"))


def _host(t: torch.Tensor) -> torch.Tensor:
    """The values of an NPU tensor, read without a host sync (GE writes them from the device)."""
    return getattr(t, "_payload", t).detach().clone()
