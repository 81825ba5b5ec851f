"""``npu_fast_gelu`` / ``fast_gelu`` and ``npu_fast_gelu_backward`` (vLLM-Ascend's ``AscendQuickGELU``):
values against torch_npu's documented formula 1 evaluated element by element in Python floats,
the backward against autograd through a plain-torch forward, autograd through the op, meta shapes,
argument errors and a compiled graph."""
from __future__ import annotations

import math

import pytest
import torch

import torch_npu
from graph.helpers import backend


def _formula_1(v: float) -> float:
    """torch_npu doc, formula 1: x / (1 + exp(-1.702|x|)) * exp(0.851 x (x - |x|)), the "x" after 0.851 read
    as a multiplication sign (CANN's FastGelu formula; read as the variable, formula 1 would not agree with
    formula 2 for x < 0 and would overflow)."""
    return v / (1 + math.exp(-1.702 * abs(v))) * math.exp(0.851 * (v - abs(v)))


def _inputs(seed=0, shape=(3, 5, 8)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 4
    x.view(-1)[:4] = torch.tensor([0.0, -30.0, 30.0, -1e-3])
    return x


@pytest.mark.parametrize("name", ["npu_fast_gelu", "fast_gelu"])
def test_fast_gelu_matches_the_documented_formula_per_element(npugraph, name):
    x = _inputs()
    y = getattr(torch_npu, name)(x.npu()).cpu()
    want = torch.tensor([_formula_1(v) for v in x.reshape(-1).tolist()]).reshape(x.shape)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    assert y.dtype == torch.float32
    npugraph.assert_clean()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_compute_in_float32_and_keep_their_dtype(npugraph, dtype):
    x = _inputs(1).to(dtype)
    y = torch_npu.npu_fast_gelu(x.npu()).cpu()
    assert y.dtype == dtype
    want = torch.tensor([_formula_1(v) for v in x.float().reshape(-1).tolist()]).reshape(x.shape).to(dtype)
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_the_backward_op_matches_autograd_of_the_plain_forward(npugraph):
    x, grad = _inputs(2), torch.randn(3, 5, 8)
    leaf = x.clone().requires_grad_()
    (leaf * (1.702 * leaf).sigmoid()).backward(grad)
    got = torch_npu.npu_fast_gelu_backward(grad.npu(), x.npu()).cpu()
    torch.testing.assert_close(got, leaf.grad, rtol=1e-5, atol=1e-6)


def test_loss_backward_through_npu_fast_gelu_runs_the_backward_op(npugraph):
    x, grad = _inputs(3), torch.randn(3, 5, 8)
    leaf = x.npu().requires_grad_()
    torch_npu.npu_fast_gelu(leaf).backward(grad.npu())
    ref = x.clone().requires_grad_()
    (ref * torch.sigmoid(ref * 1.702)).backward(grad)
    torch.testing.assert_close(leaf.grad.cpu(), ref.grad, rtol=1e-5, atol=1e-6)
    ops = [getattr(r, "op", "") for r in npugraph.trace.records]
    assert "npu::npu_fast_gelu" in ops and "npu::npu_fast_gelu_backward" in ops


def test_meta_shapes_and_the_vector_profile():
    from pytest_npugraph.runtime.ops import registry

    x = torch.empty(2, 7, 3, dtype=torch.bfloat16, device="meta")
    y = torch.ops.npu.npu_fast_gelu(x)
    assert (y.shape, y.dtype, y.device.type) == (x.shape, torch.bfloat16, "meta")
    assert torch.ops.npu.npu_fast_gelu_backward(x, x).shape == x.shape
    table = registry.table()
    for name in ("npu_fast_gelu", "fast_gelu", "npu_fast_gelu_backward"):
        assert table[name].impl is not None and table[name].cores["kind"] == "AIV"


def test_argument_errors(npugraph):
    with pytest.raises(RuntimeError, match="npu_fast_gelu: input dtype torch.int32 is not supported"):
        torch_npu.npu_fast_gelu(torch.ones(4, dtype=torch.int32).npu())
    with pytest.raises(RuntimeError, match="at most 8 dims"):
        torch_npu.npu_fast_gelu(torch.ones([1] * 9).npu())
    with pytest.raises(RuntimeError, match="grad shape"):
        torch_npu.npu_fast_gelu_backward(torch.ones(3).npu(), torch.ones(4).npu())


def _mlp(x, w):
    return torch_npu.npu_fast_gelu(x @ w) * 2


@pytest.mark.parametrize("mode", ["ge", "npugraph_ex", "reduce-overhead"])
def test_a_compiled_quick_gelu_gives_the_eager_values(npugraph, mode):
    x, w = _inputs(4, (4, 8)), torch.randn(8, 8)
    eager = _mlp(x.npu(), w.npu()).cpu()
    step = torch.compile(_mlp, backend=backend(mode), dynamic=False, fullgraph=True)
    for _ in range(2):
        torch.testing.assert_close(step(x.npu(), w.npu()).cpu(), eager)
    want = torch.tensor([_formula_1(v) for v in (x @ w).reshape(-1).tolist()]).reshape(4, 8) * 2
    torch.testing.assert_close(eager, want, rtol=1e-5, atol=1e-5)
