"""compiler/noop_ops.py (TorchAir's no-op removal without importing Inductor) against Inductor's own
``remove_noop_ops``: random graphs of every op the pass knows, at no-op and at working arguments, with
outputs that are inputs, aliases and copies of them; and every graph the compiled modes build for a
small HF Llama.  Both passes run on copies of one graph and must leave the same graph."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from torch._inductor.fx_passes import post_grad
from torch.fx.experimental.proxy_tensor import make_fx

from pytest_npugraph.compiler import noop_ops, pipeline

aten, prims = torch.ops.aten, torch.ops.prims
BIG = 2 ** 63 - 1


def _float(v):
    return [i for i, t in enumerate(v) if t.dtype == torch.float32 and t.dim() == 2]


def _apply(step, v):
    """One op on the values ``v`` (a no-op or not, by the drawn arguments); None if it does not fit."""
    kind, a, b, choice = step
    floats = _float(v)
    x = v[floats[a % len(floats)]]
    same = [v[i] for i in floats if v[i].shape == x.shape]
    y = same[b % len(same)]         # binary ops take two tensors of one shape
    if kind == "slice":
        dim = choice % 2
        start, end, step_ = [(0, x.shape[dim], 1), (0, BIG, 1), (1, BIG, 1), (0, 2, 1), (0, BIG, 2)][choice % 5]
        return aten.slice.Tensor(x, dim, start, end, step_)
    if kind == "slice_scatter":
        if choice % 2:
            return aten.slice_scatter.default(x, y, 0, 0, BIG, 1)
        return aten.slice_scatter.default(x, aten.slice.Tensor(y, 0, 0, 2), 0, 0, 2, 1) if x.shape[0] > 2 else None
    if kind == "repeat":
        return aten.repeat.default(x, [1, 1] if choice % 2 else [2, 1])
    if kind == "pad":
        return aten.constant_pad_nd.default(x, [0, 0] if choice % 2 else [1, 0])
    if kind == "convert":
        return prims.convert_element_type.default(x, torch.float32 if choice % 2 else torch.float64)
    if kind == "device_put":
        return prims.device_put.default(x, "cpu" if choice % 2 else torch.device("cpu"))
    if kind == "round":
        op = (aten.ceil.default, aten.floor.default, aten.round.default, aten.trunc.default)[choice % 4]
        return op(v[2]) if choice % 3 == 0 else op(x)        # v[2]: the int input
    if kind == "pow":
        return aten.pow.Tensor_Scalar(x, (1, 2, 1.0)[choice % 3])
    if kind == "cat":
        return aten.cat.default([x] if choice % 2 else [x, y])
    if kind == "view":
        return aten.view.default(x, list(x.shape) if choice % 2 else [x.numel()])
    if kind == "view_dtype":
        return aten.view.dtype(x, torch.float32 if choice % 2 else torch.int32)
    if kind == "copy":        # functionalized: aten.copy(clone, y)
        return aten.clone.default(x).copy_(y)
    if kind == "alias":
        return aten.alias.default(x)
    if kind == "clone":
        return aten.clone.default(x, memory_format=torch.contiguous_format) if choice % 3 == 0 else aten.clone.default(x)
    if kind == "transpose_clone":       # a clone that is not a no-op: other strides than its source
        return aten.clone.default(aten.t.default(x), memory_format=torch.contiguous_format)
    return aten.add.Tensor(x, y)


KINDS = ("slice", "slice_scatter", "repeat", "pad", "convert", "device_put", "round", "pow", "cat", "view",
         "view_dtype", "copy", "alias", "clone", "transpose_clone", "add")


@st.composite
def programs(draw):
    steps = draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 20), st.integers(0, 20),
                                    st.integers(0, 11)), min_size=1, max_size=10))
    outs = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    return steps, outs


def graph_of(steps, outs):
    def f(x, y, k):
        v = [x, y, k]
        for step in steps:
            out = _apply(step, v)
            if out is not None:
                v.append(out)
        # outputs may be inputs, several views of one base, or the same value twice
        return tuple(v[i % len(v)] for i in outs) + (v[-1],)

    inputs = (torch.randn(4, 4), torch.randn(4, 4), torch.randint(0, 9, (4, 4)))
    return make_fx(torch.func.functionalize(f, remove="mutations"), tracing_mode="fake")(*inputs)


OURS = noop_ops.remove_noop_ops


def both(graph: torch.fx.Graph) -> tuple:
    """(Inductor's result, ours, the nodes removed) on two copies of ``graph``."""
    theirs, ours = copy.deepcopy(graph), copy.deepcopy(graph)
    post_grad.remove_noop_ops(theirs)
    OURS(ours)
    return str(theirs), str(ours), len(graph.nodes) - len(ours.nodes)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(), st.booleans())
def test_same_graph_as_inductor_on_random_graphs(program, overlap_scheduling):
    gm = graph_of(*program)
    note(str(gm.graph))
    with torch._inductor.config.patch(reorder_for_compute_comm_overlap=overlap_scheduling):
        theirs, ours, _ = both(gm.graph)
    assert ours == theirs


def test_removes_no_ops_and_keeps_the_rest():
    """Not vacuous: what each side removes here is known."""
    def f(x, y):
        a = aten.slice.Tensor(x, 0, 0, BIG)             # full slice: removed
        b = aten.slice.Tensor(a, 0, 1, BIG)             # a real slice: kept
        c = aten.view.default(b, [3, 4])                # same shape: removed
        d = aten.clone.default(x)                       # a copy of an input returned: kept (no new input alias)
        e = aten.add.Tensor(c, 1)
        f_ = aten.repeat.default(e, [1, 1])             # removed
        return b, d, aten.mul.Tensor(f_, y[1:])

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 4), torch.randn(4, 4))
    theirs, ours, removed = both(gm.graph)
    assert ours == theirs and removed == 3
    noop_ops.remove_noop_ops(gm.graph)
    left = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert left == [aten.slice.Tensor, aten.clone.default, aten.add.Tensor, aten.slice.Tensor, aten.mul.Tensor]


@pytest.mark.parametrize("mode", ["ge", "reduce-overhead", "npugraph_ex"])
def test_same_graph_as_inductor_on_a_compiled_llama(mode, monkeypatch):
    """Every graph the mode's pipeline hands to the pass (an HF Llama's forward); and its static inputs
    (the parameters), which pipeline._static_input_idxs reads as Inductor's get_static_input_idxs."""
    pytest.importorskip("transformers")
    from thirdparty.models import build, prompt      # tests/ is on sys.path (rootdir-relative imports)

    from .helpers import backend

    seen = []

    def compare(graph):
        theirs, mine, removed = both(graph)
        seen.append((theirs == mine, removed))
        OURS(graph)

    monkeypatch.setattr(noop_ops, "remove_noop_ops", compare)
    static = []
    own_static = pipeline._static_input_idxs

    def compare_static(num_dynamo_inputs, num_aot_inputs):       # and the static inputs, as Inductor reads them
        from torch._inductor.compile_fx import get_static_input_idxs
        from torch._inductor.utils import num_fw_fixed_arguments

        found = own_static(num_dynamo_inputs, num_aot_inputs)
        static.append((found, list(get_static_input_idxs(num_fw_fixed_arguments(num_dynamo_inputs, num_aot_inputs)))))
        return found

    monkeypatch.setattr(pipeline, "_static_input_idxs", compare_static)
    model = build("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1).eval()
    ids = prompt(1, 8)
    with torch.no_grad():
        expected = model(ids).logits
        got = torch.compile(model.npu(), backend=backend(mode), dynamic=False)(ids.npu()).logits
    assert torch.allclose(expected, got.cpu(), atol=1e-5)
    assert seen and all(same for same, _ in seen)
    assert sum(removed for _, removed in seen) > 0      # the model's graphs have no-ops (views, slices)
    assert static and all(ours == theirs for ours, theirs in static) and any(ours for ours, _ in static)
