"""Shared helpers of the graph-mode tests: compiling with a torchair config, reading the trace."""
import torch
import torchair
from torchair.configs.compiler_config import CompilerConfig

from pytest_npugraph import trace as T


def config(mode="max-autotune", **aclgraph_debug):
    c = CompilerConfig()
    c.mode = mode
    for name, value in aclgraph_debug.items():
        setattr(c.debug.aclgraph, name, value)
    return c


def compile_with(fn, cfg=None, **kwargs):
    """``torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=cfg))``."""
    kwargs.setdefault("dynamic", False)
    kwargs.setdefault("fullgraph", True)
    return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=cfg or CompilerConfig()), **kwargs)


def reduce_overhead(fn, **aclgraph_debug):
    return compile_with(fn, config("reduce-overhead", **aclgraph_debug))


def backend(mode: str):
    """The ``torch.compile`` backend of a graph mode: "ge" (TorchAir's max-autotune), "reduce-overhead",
    or "npugraph_ex"."""
    if mode == "npugraph_ex":
        return "npugraph_ex"
    return torchair.get_npu_backend(compiler_config=config("max-autotune" if mode == "ge" else mode))


def records(npugraph, kind, start=0):
    return [r for r in npugraph.trace.records[start:] if isinstance(r, kind)]


def kernels(npugraph, op=None, graph=None):
    """Kernels whose op contains ``op`` and whose ``graph`` label contains ``graph`` ("" = eager only)."""
    found = []
    for k in records(npugraph, T.Kernel):
        if op is not None and op not in k.op:
            continue
        if graph == "" and k.graph is not None or graph and (k.graph is None or graph not in str(k.graph)):
            continue
        found.append(k)
    return found


def stream_label(npugraph, rec) -> str:
    return npugraph.trace.streams[rec.stream].label


def nodes(record, target: str) -> list:
    """Nodes of a compiled graph whose target's name contains ``target``."""
    return [n for n in record.fx_graph.graph.nodes if target in str(n.target)]
