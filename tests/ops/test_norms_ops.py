"""Residual-add norms fused with quantisation, against per-row scalar computations.

Each expected value is computed element by element in Python floats (no shared helper with the
implementation); shapes and dtypes against the wheel's meta rules; error texts against its
meta kernels.
"""
from __future__ import annotations

import math
import re

import pytest
import torch
import torch_npu  # noqa: F401  (before any backward: autograd sizes its device queues on the first one)

from pytest_npugraph.runtime.ops import norms as N


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(7)


def rint(v: float) -> int:
    """Round half to even, like Python's round()."""
    return round(v)


def sat(v: int, lo=-128, hi=127) -> int:
    return max(lo, min(hi, v))


def rms_row(values, gamma, beta, eps):
    inv = 1.0 / math.sqrt(sum(v * v for v in values) / len(values) + eps)
    return [v * inv * g + (b if beta is not None else 0.0) for v, g, b in
            zip(values, gamma, beta if beta is not None else [0.0] * len(values))]


def rows_of(t):
    return t.float().reshape(-1, t.size(-1)).tolist()


@pytest.mark.parametrize("div_mode", [True, False])
def test_add_rms_norm_quant_matches_scalar_formula(div_mode):
    x1, x2 = torch.randn(3, 8, dtype=torch.float16), torch.randn(3, 8, dtype=torch.float16)
    gamma, beta = torch.randn(8, dtype=torch.float16), torch.randn(8, dtype=torch.float16)
    scales1 = torch.rand(8) * 0.05 + 0.01 if div_mode else torch.rand(8) * 40 + 10
    zp1 = torch.randint(-5, 5, (8,), dtype=torch.int32)
    y1, y2, x = N.npu_add_rms_norm_quant(x1, x2, gamma, scales1, zp1, beta, epsilon=1e-5, div_mode=div_mode)
    assert (y1.dtype, y1.shape, x.dtype) == (torch.int8, (3, 8), torch.float16)
    assert torch.equal(y2, torch.zeros(3, 8, dtype=torch.int8))        # no scales2: not produced
    for r, (a, b) in enumerate(zip(rows_of(x1), rows_of(x2))):
        total = [p + q for p, q in zip(a, b)]
        y = rms_row(total, gamma.float().tolist(), beta.float().tolist(), 1e-5)
        expected = [sat(rint((v / s if div_mode else v * s) + z)) for v, s, z in
                    zip(y, scales1.tolist(), zp1.tolist())]
        got = y1[r].tolist()
        assert all(abs(g - e) <= 1 for g, e in zip(got, expected)), (got, expected)   # fp16 input rounding
        assert sum(g != e for g, e in zip(got, expected)) <= 1
    torch.testing.assert_close(x, (x1.float() + x2.float()).half())


def test_add_rms_norm_quant_second_output_uses_scales2_and_saturates():
    x1, x2 = torch.full((2, 4), 3.0), torch.zeros(2, 4)           # a constant row normalises to 1
    gamma = torch.tensor([1.0, -1.0, 2.0, -2.0])
    tiny = torch.full((4,), 1e-4)
    y1, y2, _ = N.npu_add_rms_norm_quant(x1, x2, gamma, torch.ones(4), None, None, tiny, None)
    assert y1.tolist() == [[1, -1, 2, -2]] * 2
    assert y2.tolist() == [[127, -128, 127, -128]] * 2                  # y / 1e-4 saturates


def test_add_rms_norm_quant_axis_and_dst_type_errors():
    args = (torch.randn(2, 4), torch.randn(2, 4), torch.ones(4), torch.ones(4), None)
    with pytest.raises(RuntimeError, match=re.escape("axis should be -1, but got 0.")):
        N.npu_add_rms_norm_quant(*args, axis=0)
    with pytest.raises(RuntimeError, match=re.escape("axis should be -1, but got 1.")):
        N._add_rms_norm_quant_meta(*[a.to("meta") if a is not None else None for a in args], axis=1)
    with pytest.raises(NotImplementedError, match="dst_type"):
        N.npu_add_rms_norm_quant(*args, dst_type=24)


def test_add_rms_norm_quant_meta_shapes():
    x = torch.empty(2, 3, 8, device="meta", dtype=torch.bfloat16)
    g = torch.empty(8, device="meta", dtype=torch.bfloat16)
    y1, y2, xo = N._add_rms_norm_quant_meta(x, x, g, g.float(), None)
    assert [(t.shape, t.dtype) for t in (y1, y2, xo)] == [((2, 3, 8), torch.int8)] * 2 + [((2, 3, 8), torch.bfloat16)]


def _dynamic_expected(y_rows, smooth, bound):
    out, scales = [], []
    for row in y_rows:
        t = [v * s for v, s in zip(row, smooth)] if smooth is not None else row
        scale = max(abs(v) for v in t) / bound
        scales.append(scale)
        out.append([sat(rint(v / scale), -bound - 1, bound) for v in t])
    return out, scales


def test_add_rms_norm_dynamic_quant_two_smoothed_paths():
    x1, x2 = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    gamma, beta = torch.rand(8) + 0.5, torch.randn(8) * 0.1
    s1, s2 = torch.rand(8) + 0.5, torch.rand(8) + 0.5
    y1, y2, x, sc1, sc2 = N.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1=s1, smooth_scale2=s2,
                                                           beta=beta, epsilon=1e-6)
    assert (y1.shape, y2.shape, sc1.shape, sc2.shape) == ((2, 3, 8), (2, 3, 8), (2, 3), (2, 3))
    y_rows = [rms_row([p + q for p, q in zip(a, b)], gamma.tolist(), beta.tolist(), 1e-6)
              for a, b in zip(rows_of(x1), rows_of(x2))]
    for got_y, got_s, smooth in ((y1, sc1, s1), (y2, sc2, s2)):
        exp_y, exp_s = _dynamic_expected(y_rows, smooth.tolist(), 127)
        assert got_y.reshape(-1, 8).tolist() == exp_y
        torch.testing.assert_close(got_s.reshape(-1), torch.tensor(exp_s), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(x, x1 + x2)


def test_add_rms_norm_dynamic_quant_without_smooth_gives_one_path_and_empty_second():
    x1, x2, gamma = torch.randn(4, 16), torch.randn(4, 16), torch.ones(16)
    y1, y2, _, s1, s2 = N.npu_add_rms_norm_dynamic_quant(x1, x2, gamma)
    assert y1.shape == (4, 16) and y2.shape == (0,) and s2.shape == (0,) and s1.shape == (4,)
    assert y1.abs().amax(dim=-1).tolist() == [127] * 4      # the row max maps to the bound


def test_add_rms_norm_dynamic_quant_int4_packs_eight_per_word():
    from pytest_npugraph.runtime.ops._common import unpack_int4

    x1, x2, gamma = torch.randn(2, 16), torch.randn(2, 16), torch.ones(16)
    y1, _, _, s1, _ = N.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, y_dtype=torch.quint4x2)
    assert (y1.dtype, y1.shape) == (torch.int32, (2, 2))
    values = unpack_int4(y1)
    y_rows = [rms_row([p + q for p, q in zip(a, b)], [1.0] * 16, None, 1e-6) for a, b in zip(rows_of(x1), rows_of(x2))]
    exp, scales = _dynamic_expected(y_rows, None, 7)
    assert values.tolist() == exp
    torch.testing.assert_close(s1, torch.tensor(scales))


def test_add_rms_norm_dynamic_quant_output_mask_rules_and_meta():
    x1, x2, gamma = torch.randn(2, 8), torch.randn(2, 8), torch.ones(8)
    with pytest.raises(RuntimeError, match="When the output_mask is not empty, at least one of y1 and y2 must be "
                                           "output."):
        N.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, output_mask=[False, False])
    y1, y2, _, s1, s2 = N.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, output_mask=[False, True])
    assert y1.shape == (0,) and y2.shape == (2, 8) and s1.shape == (0,) and s2.shape == (2,)
    with pytest.raises(RuntimeError, match=re.escape("Parameter y_dtype enum value:99 not found")):
        N._add_rms_norm_dynamic_quant_meta(x1.to("meta"), x2.to("meta"), gamma.to("meta"), y_dtype=99)
    metas = N._add_rms_norm_dynamic_quant_meta(x1.to("meta"), x2.to("meta"), gamma.to("meta"),
                                               smooth_scale1=gamma.to("meta"), smooth_scale2=gamma.to("meta"),
                                               y_dtype=16)
    assert [tuple(t.shape) for t in metas] == [(2, 1), (2, 1), (2, 8), (2,), (2,)]
    assert metas[0].dtype == torch.int32


@pytest.mark.parametrize("gamma_shape", [(8,), (3, 8)])
def test_add_layer_norm_matches_scalar_formula(gamma_shape):
    x1, x2 = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    gamma, beta = torch.randn(gamma_shape), torch.randn(gamma_shape)
    y, mean, rstd, x = N.npu_add_layer_norm(x1, x2, gamma, beta, 1e-5)
    width = gamma.numel()
    stat_shape = (2, 3, 1) if len(gamma_shape) == 1 else (2, 1, 1)
    assert mean.shape == rstd.shape == stat_shape and mean.dtype == rstd.dtype == torch.float32
    flat_x = (x1 + x2).reshape(-1, width).tolist()
    for r, row in enumerate(flat_x):
        mu = sum(row) / width
        var = sum((v - mu) ** 2 for v in row) / width
        inv = 1 / math.sqrt(var + 1e-5)
        expected = [(v - mu) * inv * g + b for v, g, b in zip(row, gamma.reshape(-1).tolist(),
                                                                beta.reshape(-1).tolist())]
        torch.testing.assert_close(y.reshape(-1, width)[r], torch.tensor(expected), rtol=1e-4, atol=1e-5)
        assert mean.reshape(-1)[r].item() == pytest.approx(mu, abs=1e-5)
        assert rstd.reshape(-1)[r].item() == pytest.approx(inv, rel=1e-4)
    torch.testing.assert_close(x, x1 + x2)
    metas = N._add_layer_norm_meta(x1.to("meta"), x2.to("meta"), gamma.to("meta"), beta.to("meta"))
    assert [tuple(t.shape) for t in metas] == [(2, 3, 8), stat_shape, stat_shape, (2, 3, 8)]


# ------------------------------------------------------------------ npu_rms_norm's backward
def _rms_norm_reference(x, gamma, eps):
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    return x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps) * gamma


@pytest.mark.parametrize("shape,gamma_shape", [((4, 8), (8,)), ((2, 3, 4, 6), (4, 6))])
def test_rms_norm_backward_matches_autograd_of_the_formula(shape, gamma_shape):
    x = torch.randn(shape, dtype=torch.float64)
    gamma = torch.rand(gamma_shape, dtype=torch.float64) + 0.5
    dy = torch.randn(shape, dtype=torch.float64)
    ref_x, ref_gamma = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    _rms_norm_reference(ref_x, ref_gamma, 1e-6).backward(dy)
    _, rstd = N.npu_rms_norm(x, gamma)
    dx, dgamma = N.npu_rms_norm_backward(dy, x, gamma, rstd)
    assert dx.dtype == x.dtype and dgamma.dtype == torch.float32 and dgamma.shape == gamma.shape
    torch.testing.assert_close(dx, ref_x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dgamma, ref_gamma.grad.float(), rtol=1e-5, atol=1e-5)


def test_npu_rms_norm_is_differentiable_on_the_device(npugraph):
    # torch_npu registers NpuRmsNormBackward0 (through npu_rms_norm_backward): x and gamma get gradients
    x = torch.randn(3, 8, device="npu", requires_grad=True)
    gamma = (torch.rand(8) + 0.5).npu().requires_grad_()
    dy = torch.randn(3, 8)
    torch_npu.npu_rms_norm(x, gamma)[0].backward(dy.npu())
    ref_x = x.detach().cpu().requires_grad_()
    ref_gamma = gamma.detach().cpu().requires_grad_()
    _rms_norm_reference(ref_x, ref_gamma, 1e-6).backward(dy)
    torch.testing.assert_close(x.grad.cpu(), ref_x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gamma.grad.cpu(), ref_gamma.grad, rtol=1e-4, atol=1e-5)


def test_npu_add_rms_norm_cast_widens_the_half_precision_result():
    """aclnnAddRmsNormCast: y1 = float(y2), y2 = npu_add_rms_norm's y (the fused kernel TorchAir's pattern
    fusion puts in place of npu_add_rms_norm followed by a cast to float32); half-precision inputs only."""
    x1, x2 = torch.randn(2, 3, 8, dtype=torch.float16).npu(), torch.randn(2, 3, 8, dtype=torch.float16).npu()
    gamma = torch.rand(8, dtype=torch.float16).npu()
    y_cast, y, rstd, total = torch_npu.npu_add_rms_norm_cast(x1, x2, gamma, 1e-5)
    ref_y, ref_rstd, ref_total = torch_npu.npu_add_rms_norm(x1, x2, gamma, 1e-5)
    assert y_cast.dtype == torch.float32 and torch.equal(y_cast.cpu(), ref_y.cpu().float())
    assert torch.equal(y.cpu(), ref_y.cpu()) and torch.equal(rstd.cpu(), ref_rstd.cpu())
    assert torch.equal(total.cpu(), ref_total.cpu())
    with pytest.raises(RuntimeError, match="x1 must be float16 or bfloat16"):
        torch_npu.npu_add_rms_norm_cast(x1.float(), x2.float(), gamma.float())
