"""TorchAir's no-op removal (``experimental_config.remove_noop_ops``), without importing Inductor.

Why: TorchAir runs ``torch._inductor.fx_passes.post_grad.remove_noop_ops`` on every graph, and
importing that module pulls in Inductor's lowerings, kernels and code generators: about 1.3 s of CPU
once per process, most of a first compile here (real TorchAir pays it at ``import torchair``,
npu_fx_compiler.py, on hardware too).  This module applies the same rules to the graph with only
what AOTAutograd has already loaded (``torch._decomp``, ``torch._inductor.fx_utils``): a node whose
op is a no-op for its arguments (a full slice, ``repeat`` by ones, a zero pad, a cast to its own
dtype, a ``view`` to its own shape, ``clone``/``alias``/``copy``, ``cat`` of one tensor, ...) and
whose value has the same metadata as its source is replaced by that source, unless doing so would
make a graph output alias an input or another output anew.  tests/compiler/test_noop_ops.py checks
it against Inductor's pass on random graphs and on the graphs the test suite compiles.
"""
from __future__ import annotations

import torch
from torch._decomp import register_decomposition
from torch._prims_common import is_integer_dtype
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

aten = torch.ops.aten
_BIG = 2 ** 63 - 1

_registry: dict = {}       # OpOverload -> (condition on fake args, index of the source argument)


def _noop(targets, source=0):
    def register(condition):
        # torch._decomp's registration, as Inductor's: a packet stands for each of its overloads
        register_decomposition(targets, registry=_registry, unsafe=True)((condition, source))
        return condition

    return register


def _spmd_graph_preserved() -> bool:
    """Inductor keeps no-op slices and pads when its compute/communication overlap scheduling is on
    (every rank must see the same graph); its config module is loaded with Dynamo."""
    from torch._inductor import config

    distributed = getattr(config, "aten_distributed_optimizations", None)
    return bool(getattr(distributed, "enable_overlap_scheduling", False)
                or getattr(config, "reorder_for_compute_comm_overlap", False))


@_noop(aten.slice)
def _slice(self, dim=0, start=None, end=None, step=1):
    if _spmd_graph_preserved() or start is None or end is None:
        return False
    return (statically_known_true(sym_eq(start, 0))
            and (statically_known_true(end >= _BIG) or statically_known_true(end >= self.shape[dim]))
            and statically_known_true(sym_eq(step, 1)))


@_noop(aten.slice_scatter, 1)
def _slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    start = 0 if start is None else start
    end = _BIG if end is None else end
    return (self.shape == src.shape and start == 0
            and (statically_known_true(end >= _BIG) or statically_known_true(end >= self.shape[dim]))
            and step == 1)


@_noop(aten.repeat)
def _repeat(self, repeats):
    return all(r == 1 for r in repeats)


@_noop(aten.constant_pad_nd)
def _constant_pad_nd(x, padding, fill_value=0):
    return not _spmd_graph_preserved() and all(p == 0 for p in padding)


@_noop(torch.ops.prims.convert_element_type)
def _convert_element_type(x, dtype):
    return x.dtype == dtype


@_noop(torch.ops.prims.device_put)
def _device_put(x, device, non_blocking=True):
    from torch._inductor.utils import decode_device      # loaded with Dynamo

    return x.device == decode_device(device)


@_noop([aten.ceil, aten.floor, aten.round, aten.trunc])
def _integer_rounding(x):
    return is_integer_dtype(x.dtype)


@_noop([aten.pow])
def _pow(a, b):
    return isinstance(b, int) and b == 1


@_noop([aten.cat], lambda args: args[0][0])
def _cat(inputs, dim=0):
    return len(inputs) == 1


@_noop(aten.view.default)
def _view(arg, size):
    return statically_known_true(sym_eq(arg.shape, tuple(size)))


@_noop(aten.view.dtype)
def _view_dtype(arg, dtype):
    return arg.dtype == dtype


# with the same-metadata check every node passes, these are always no-ops
@_noop([aten.copy], 1)
@_noop([aten.alias, aten.clone])
def _always(*args, **kwargs):
    return True


def _same_meta(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Same size, layout, dtype, device, strides (strided tensors), conjugate and negative bits."""
    x, y = a.meta.get("val"), b.meta.get("val")
    return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
            and statically_known_true(sym_eq(x.size(), y.size()))
            and x.layout == y.layout and x.dtype == y.dtype and x.device == y.device
            and (x.layout != torch.strided or statically_known_true(sym_eq(x.stride(), y.stride())))
            and x.is_conj() == y.is_conj() and x.is_neg() == y.is_neg())


def remove_noop_ops(graph: torch.fx.Graph) -> None:
    """Replace each no-op node by its source (the rules of Inductor's ``remove_noop_ops``)."""
    from torch._inductor.fx_utils import get_fake_args_kwargs, get_node_storage

    inputs = set(graph.find_nodes(op="placeholder"))
    input_storages = {get_node_storage(node) for node in inputs}
    output = next(iter(reversed(graph.nodes)))
    assert output.op == "output"
    outputs = output.args[0]
    if not isinstance(outputs, (list, tuple)):      # nested subgraphs may return one value
        outputs = (outputs,)
    output_storages = {get_node_storage(out) for out in outputs if isinstance(out, torch.fx.Node)}
    for node in graph.nodes:
        entry = _registry.get(node.target)
        if entry is None:
            continue
        condition, source = entry
        src = node.args[source] if isinstance(source, int) else source(node.args)
        if not isinstance(src, torch.fx.Node):
            continue
        if node.target is aten.copy.default:
            dst = node.args[0]
            if isinstance(dst, torch.fx.Node) and dst.op == "call_function" and dst.kwargs.get("pin_memory") is True:
                continue
        node_storage, src_storage = get_node_storage(node), get_node_storage(src)
        is_view = node_storage == src_storage
        # no new aliasing between inputs and outputs, and no output that is its source node
        if (not is_view and node_storage in output_storages
                and (src_storage in input_storages or src_storage in output_storages)):
            continue
        if is_view and node in output.args and (src in inputs or src in output.args):
            continue
        valid, args, kwargs = get_fake_args_kwargs(node)
        if valid and _same_meta(node, src) and condition(*args, **kwargs):
            node.replace_all_uses_with(src)
            graph.erase_node(node)
