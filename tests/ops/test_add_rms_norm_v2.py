"""``npu_add_rms_norm_v2`` (in place) and ``npu_add_rms_norm_v2_functional``.

The in-place op writes ``rms_norm(x1+x2)*gamma`` into x1 and ``x1+x2`` into x2 and returns rstd;
the functional variant returns (rstd, new x1, new x2).  Under functionalization the in-place op
must become the functional op plus ``copy_`` epilogues, as torch_npu's generated Functionalize
kernel makes it (not ``auto_functionalized``).  Expected values are computed row by row in
float64, independently of the reference module.
"""
from __future__ import annotations

import math
import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_npu  # noqa: F401  (installs the npu device and torch.ops.npu)

from pytest_npugraph.runtime.tensor import span
from pytest_npugraph.trace import Kernel

V2 = torch.ops.npu.npu_add_rms_norm_v2
V2_FUNCTIONAL = torch.ops.npu.npu_add_rms_norm_v2_functional


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(2024)


def expected(x1, x2, gamma, eps=1e-6):
    """(rstd, new x1, new x2) by explicit loops over the rows of the trailing gamma.dim() dims."""
    n = gamma.numel()
    lead = x1.shape[:x1.dim() - gamma.dim()]
    a = x1.double().reshape(-1, n).tolist()
    b = x2.double().reshape(-1, n).tolist()
    g = gamma.double().reshape(-1).tolist()
    rstd, y, s = [], [], []
    for ra, rb in zip(a, b):
        total = [u + v for u, v in zip(ra, rb)]
        inv = 1.0 / math.sqrt(sum(t * t for t in total) / n + eps)
        rstd.append(inv)
        y.append([t * inv * w for t, w in zip(total, g)])
        s.append(total)
    as_tensor = torch.tensor
    return (as_tensor(rstd, dtype=torch.float64).reshape(*lead, *([1] * gamma.dim())),
            as_tensor(y, dtype=torch.float64).reshape(x1.shape),
            as_tensor(s, dtype=torch.float64).reshape(x2.shape))


def close(actual, want, tol=1e-5):
    torch.testing.assert_close(actual.cpu().double(), want, atol=tol, rtol=tol)


def kernels(npugraph, name):
    return [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.op.split(".")[0].endswith(name)]


# --------------------------------------------------------------------------------- eager values
@pytest.mark.parametrize("gamma_shape", [(16,), (3, 16)])
def test_functional_returns_rstd_norm_and_sum(gamma_shape):
    x1, x2, gamma = torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.rand(gamma_shape)
    before = (x1.clone(), x2.clone())
    rstd, y, s = V2_FUNCTIONAL(x1, x2, gamma, 1e-5)
    want = expected(x1, x2, gamma, 1e-5)
    close(rstd, want[0])
    close(y, want[1])
    close(s, want[2])
    assert rstd.dtype == torch.float32 and rstd.shape == want[0].shape
    torch.testing.assert_close((x1, x2), before, rtol=0, atol=0)   # inputs untouched


def test_inplace_on_cpu_writes_both_inputs_and_returns_rstd():
    x1, x2, gamma = torch.randn(4, 16), torch.randn(4, 16), torch.rand(16)
    want = expected(x1, x2, gamma)
    p1, p2 = x1.data_ptr(), x2.data_ptr()
    rstd = V2(x1, x2, gamma)
    assert (x1.data_ptr(), x2.data_ptr()) == (p1, p2)
    close(rstd, want[0])
    close(x1, want[1])
    close(x2, want[2])
    assert rstd.shape == (4, 1) and rstd.dtype == torch.float32


def test_inplace_half_precision_keeps_dtypes():
    x1, x2 = torch.randn(3, 32, dtype=torch.float16), torch.randn(3, 32, dtype=torch.float16)
    gamma = torch.rand(32, dtype=torch.float16)
    want = expected(x1, x2, gamma)
    rstd = V2(x1, x2, gamma)
    assert x1.dtype == x2.dtype == torch.float16 and rstd.dtype == torch.float32
    close(rstd, want[0], tol=1e-3)
    close(x1, want[1], tol=2e-2)
    close(x2, want[2], tol=2e-3)


def test_inplace_on_npu_mutates_in_place_and_records_both_writes(npugraph):
    c1, c2, cg = torch.randn(4, 16), torch.randn(4, 16), torch.rand(16)
    want = expected(c1, c2, cg)
    x1, x2, gamma = c1.npu(), c2.npu(), cg.npu()
    p1, p2 = x1.data_ptr(), x2.data_ptr()
    s1, s2, sg = span(x1), span(x2), span(gamma)
    rstd = torch_npu.npu_add_rms_norm_v2(x1, x2, gamma)
    assert rstd.device.type == x1.device.type == "npu"
    assert (x1.data_ptr(), x2.data_ptr()) == (p1, p2)
    close(x1, want[1])
    close(x2, want[2])
    close(rstd, want[0])
    (k,) = kernels(npugraph, "npu_add_rms_norm_v2")
    assert s1 in k.writes and s2 in k.writes and span(rstd) in k.writes
    assert sg in k.reads and s1 not in k.reads and s2 not in k.reads
    assert k.cores.kind == "AIV" and k.cores.vector == npugraph.vector_cores


def test_functional_on_npu_reads_inputs_and_writes_fresh_outputs(npugraph):
    x1, x2, gamma = torch.randn(4, 16).npu(), torch.randn(4, 16).npu(), torch.rand(16).npu()
    rstd, y, s = torch_npu.npu_add_rms_norm_v2_functional(x1, x2, gamma)
    close(y, expected(x1.cpu(), x2.cpu(), gamma.cpu())[1])
    (k,) = kernels(npugraph, "npu_add_rms_norm_v2_functional")
    assert {span(x1), span(x2), span(gamma)} <= set(k.reads)
    assert set(k.writes) == {span(rstd), span(y), span(s)}
    assert k.cores.kind == "AIV"


# --------------------------------------------------------------------------------- meta / fake
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_meta_shapes_and_dtypes(dtype):
    x1 = torch.empty(2, 5, 3, 8, dtype=dtype, device="meta")
    x2 = torch.empty(2, 5, 3, 8, dtype=dtype, device="meta")
    gamma = torch.empty(3, 8, dtype=dtype, device="meta")
    rstd, y, s = V2_FUNCTIONAL(x1, x2, gamma)
    assert (rstd.shape, rstd.dtype, rstd.device.type) == ((2, 5, 1, 1), torch.float32, "meta")
    assert (y.shape, y.dtype) == (x1.shape, dtype) and (s.shape, s.dtype) == (x2.shape, dtype)
    rstd = V2(x1, x2, gamma)
    assert (rstd.shape, rstd.dtype, rstd.device.type) == ((2, 5, 1, 1), torch.float32, "meta")


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x1 = mode.from_tensor(torch.empty(4, 16, dtype=torch.bfloat16))
        x2 = mode.from_tensor(torch.empty(4, 16, dtype=torch.bfloat16))
        gamma = mode.from_tensor(torch.empty(16, dtype=torch.bfloat16))
        rstd = V2(x1, x2, gamma)
        outs = V2_FUNCTIONAL(x1, x2, gamma)
    assert (rstd.shape, rstd.dtype) == ((4, 1), torch.float32)
    assert [(tuple(t.shape), t.dtype) for t in outs] == [((4, 1), torch.float32), ((4, 16), torch.bfloat16),
                                                         ((4, 16), torch.bfloat16)]


# --------------------------------------------------------------------------------- functionalization
def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _assert_functionalized(gm, mutated_placeholders):
    """The graph calls the functional op, unpacks it with getitem and copies new x1/x2 back."""
    targets = _targets(gm)
    assert not any("auto_functionalized" in str(t) for t in targets), gm.code
    assert V2.default not in targets, gm.code
    (call,) = [n for n in gm.graph.nodes if n.target is V2_FUNCTIONAL.default]
    items = {n.args[1]: n for n in call.users if n.target is operator.getitem}
    assert set(items) == set(range(len(call.users))) and {1, 2} <= set(items), gm.code
    copies = [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert [(c.args[0], c.args[1]) for c in copies] == [(mutated_placeholders[0], items[1]),
                                                       (mutated_placeholders[1], items[2])], gm.code
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert all(p in placeholders for p in mutated_placeholders)


def model(x1, x2, gamma):
    rstd = torch.ops.npu.npu_add_rms_norm_v2(x1, x2, gamma)
    return rstd * 2


def test_functionalize_make_fx_uses_functional_op_and_copy_epilogues():
    x1, x2, gamma = torch.randn(2, 8), torch.randn(2, 8), torch.rand(8)
    gm = make_fx(torch.func.functionalize(model, remove="mutations_and_views"))(x1, x2, gamma)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    _assert_functionalized(gm, placeholders[:2])
    # the traced graph does what eager does
    a, b, c, d = x1.clone(), x2.clone(), x1.clone(), x2.clone()
    torch.testing.assert_close(gm(a, b, gamma), model(c, d, gamma))
    torch.testing.assert_close((a, b), (c, d))


def test_functionalize_without_make_fx_mutates_the_caller_tensors():
    x1, x2, gamma = torch.randn(3, 8), torch.randn(3, 8), torch.rand(8)
    want = expected(x1, x2, gamma)
    out = torch.func.functionalize(model)(x1, x2, gamma)
    close(out, want[0] * 2)
    close(x1, want[1])
    close(x2, want[2])


def test_functionalizing_an_intermediate_needs_no_copy_back():
    def f(a, b, gamma):
        x1, x2 = a + 1, b * 2
        rstd = torch.ops.npu.npu_add_rms_norm_v2(x1, x2, gamma)
        return rstd, x1, x2

    a, b, gamma = torch.randn(2, 8), torch.randn(2, 8), torch.rand(8)
    gm = make_fx(torch.func.functionalize(f, remove="mutations_and_views"))(a, b, gamma)
    targets = _targets(gm)
    assert V2_FUNCTIONAL.default in targets and torch.ops.aten.copy_.default not in targets, gm.code
    got = gm(a, b, gamma)
    want = expected(a + 1, b * 2, gamma)
    for g, w in zip(got, want):
        close(g, w)


def _aot_capture(keep_inference_input_mutations=True):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def fw_compiler(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler,
                                     keep_inference_input_mutations=keep_inference_input_mutations)
    return backend, graphs


def test_aot_autograd_on_cpu_tensors():
    torch._dynamo.reset()
    backend, graphs = _aot_capture()
    x1, x2, gamma = torch.randn(2, 8), torch.randn(2, 8), torch.rand(8)
    a, b = x1.clone(), x2.clone()
    out = torch.compile(model, backend=backend, fullgraph=True)(a, b, gamma)
    (gm,) = graphs
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    _assert_functionalized(gm, placeholders[:2])
    want = expected(x1, x2, gamma)
    close(out, want[0] * 2)
    close(a, want[1])
    close(b, want[2])


def test_aot_autograd_on_npu_tensors(npugraph):
    torch._dynamo.reset()
    backend, graphs = _aot_capture()
    c1, c2, cg = torch.randn(4, 16), torch.randn(4, 16), torch.rand(16)
    want = expected(c1, c2, cg)
    x1, x2, gamma = c1.npu(), c2.npu(), cg.npu()
    p1, p2 = x1.data_ptr(), x2.data_ptr()
    out = torch.compile(model, backend=backend, fullgraph=True)(x1, x2, gamma)
    (gm,) = graphs
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    vals = [n.meta.get("val") for n in placeholders.values()]
    assert all(v.device.type == "npu" for v in vals if isinstance(v, torch.Tensor))
    (call,) = [n for n in gm.graph.nodes if n.target is V2_FUNCTIONAL.default]
    mutated = [call.args[0], call.args[1]]
    assert all(m.op == "placeholder" for m in mutated)
    _assert_functionalized(gm, mutated)
    assert out.device.type == "npu" and (x1.data_ptr(), x2.data_ptr()) == (p1, p2)
    close(out, want[0] * 2)
    close(x1, want[1])
    close(x2, want[2])
    (k,) = kernels(npugraph, "npu_add_rms_norm_v2_functional")
    assert {span(x1), span(x2), span(gamma)} <= set(k.reads) and not {span(x1), span(x2)} & set(k.writes)
    assert not kernels(npugraph, "npu_add_rms_norm_v2")
    copy_writes = [w for r in npugraph.trace.records if isinstance(r, Kernel) and r.op == "aten::copy_"
                   for w in r.writes]
    assert copy_writes == [span(x1), span(x2)]     # the epilogues write the new values back


def test_aot_autograd_default_returns_new_values_as_graph_outputs():
    """Without keep_inference_input_mutations AOTAutograd copies back outside the graph: the
    graph returns the functional op's new x1/x2, and the caller's tensors are still updated."""
    torch._dynamo.reset()
    backend, graphs = _aot_capture(keep_inference_input_mutations=False)
    x1, x2, gamma = torch.randn(2, 8), torch.randn(2, 8), torch.rand(8)
    a, b = x1.clone(), x2.clone()
    torch.compile(model, backend=backend, fullgraph=True)(a, b, gamma)
    (gm,) = graphs
    targets = _targets(gm)
    assert V2_FUNCTIONAL.default in targets and torch.ops.aten.copy_.default not in targets
    assert not any("auto_functionalized" in str(t) for t in targets)
    want = expected(x1, x2, gamma)
    close(a, want[1])
    close(b, want[2])


def test_mixing_functional_and_plain_tensors_is_rejected():
    plain = (torch.randn(2, 8), torch.randn(2, 8))   # captured, so not wrapped by functionalize

    def f(gamma):
        return torch.ops.npu.npu_add_rms_norm_v2(plain[0], plain[1], gamma)

    with pytest.raises(RuntimeError, match="mutating a non-functional tensor with a functional tensor"):
        torch.func.functionalize(f)(torch.rand(8))
