"""Executing an FX graph node by node over NPU tensors.

Why not ``torch.fx.Interpreter``: the modes need hooks around every node (the stream it runs on, the
events around it, its core limit) and every node's device work must carry the node's line in the
user's model (``node.meta["stack_trace"]``) rather than the frame that called the compiled model.
Intermediate values are dropped after their last use, so the allocator sees the same frees (and
reuses) as a real execution."""
from __future__ import annotations

import contextlib

import torch
from torch.fx.node import map_arg

from ..runtime.backend import device_index
from ..runtime.runtime import current
from .fxgraph import node_site


class Runner:
    def __init__(self, gm):
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.sites = {n: node_site(n) for n in self.nodes}
        position = {n: i for i, n in enumerate(self.nodes)}
        last_use: dict = {}
        for node in self.nodes:
            for used in node.all_input_nodes:
                last_use[used] = position[node]
        self.release = [[] for _ in self.nodes]
        for used, i in last_use.items():
            if self.nodes[i].op != "output":
                self.release[i].append(used)

    def run(self, *args):
        rt = current()
        env: dict = {}
        inputs = iter(args)
        self.begin(rt, args)
        try:
            for i, node in enumerate(self.nodes):
                if node.op == "placeholder":
                    env[node] = next(inputs)
                    continue
                if node.op == "output":
                    return self.finish(rt, map_arg(node.args[0], env.__getitem__))
                rt.set_site_hint(self.sites[node])
                try:
                    env[node] = self.execute(rt, node, map_arg(node.args, env.__getitem__),
                                             map_arg(node.kwargs, env.__getitem__))
                finally:
                    rt.set_site_hint(None)
                for dead in self.release[i]:
                    del env[dead]
        finally:
            self.end(rt)
        raise RuntimeError(f"graph {self.gm} has no output node")

    # ----------------------------------------------------------------------- hooks
    def begin(self, rt, args) -> None:
        """Before the first node."""

    def finish(self, rt, outputs):
        """At the output node: the value the graph returns."""
        return outputs

    def end(self, rt) -> None:
        """After the run, also when a node raised."""

    def execute(self, rt, node, args, kwargs):
        return self.call(node, args, kwargs)

    def call(self, node, args, kwargs):
        if node.op == "call_function":
            dense = _dense_kernel(node.target)
            return (dense or node.target)(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "call_module":
            return self.gm.get_submodule(node.target)(*args, **kwargs)
        if node.op == "get_attr":
            value = self.gm
            for part in node.target.split("."):
                value = getattr(value, part)
            return value
        raise RuntimeError(f"unsupported FX node {node.format_node()}")


def _dense_kernel(target):
    """``auto_functionalized(_v2)`` (a custom op with mutable arguments that no pass decomposed) runs
    its dense kernel directly: clone the bases, run the op, return the new values.  Dispatching the
    higher-order op would stop at AOTAutograd's custom-op aliasing mode, which gives up on tensor
    subclasses (NotImplemented) without trying the subclass."""
    name = getattr(target, "__name__", None)
    if name not in ("auto_functionalized", "auto_functionalized_v2") or not isinstance(
            target, torch._ops.HigherOrderOperator):
        return None
    from torch._higher_order_ops import auto_functionalize

    return getattr(auto_functionalize, f"{name}_dense")


def device_of(args, rt) -> int:
    """The device a compiled graph runs on: that of its NPU tensor inputs (Dynamo guards each compiled
    graph's inputs on their device), else the calling thread's current device.  Its capture, replays,
    input copies, output clones, pool and streams all live there."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "npu":
            return a.device.index
    return device_index()


def on_device(device: int, rt):
    """Make ``device`` the calling thread's current device for a graph's call (a no-op when it is):
    the streams, events and pools the call makes or uses are that device's."""
    if device == device_index():
        return contextlib.nullcontext()
    return torch.npu.device(device)


def record_node(rt):
    """``air.record``: an event recorded on the current stream (the codegen of TorchAir's passes)."""
    event = torch.npu.Event()
    event.record(torch.npu.current_stream())
    return event


def wait_node(events) -> None:
    """``air.wait``: the current stream waits for each record."""
    stream = torch.npu.current_stream()
    for event in events:
        event.wait(stream)
