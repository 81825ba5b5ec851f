"""Quantisation ops against element-wise Python computations and hand-packed int4 words."""
from __future__ import annotations

import re

import pytest
import torch

from pytest_npugraph.runtime.ops import quant as Q


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(11)


def sat(v, lo, hi):
    return max(lo, min(hi, v))


def nibble_word(values):
    """Eight signed int4 values -> the int32 word holding value j in bits 4j..4j+3 (written by hand)."""
    word = 0
    for j, v in enumerate(values):
        word |= (v & 0xF) << (4 * j)
    return word - (1 << 32) if word >= 1 << 31 else word


# ============================================================================ npu_quantize
@pytest.mark.parametrize("dtype,lo,hi,store", [(torch.qint8, -128, 127, torch.int8), (torch.quint8, 0, 255, torch.uint8),
                                              (torch.qint32, -2 ** 31, 2 ** 31 - 1, torch.int32)])
def test_quantize_divides_adds_zero_point_rounds_and_saturates(dtype, lo, hi, store):
    x = torch.randn(2, 3, 4) * 50
    scales, zp = torch.rand(3) + 0.2, torch.tensor([1, -2, 3], dtype=torch.int32)
    y = Q.npu_quantize(x, scales, zp, dtype)      # axis=1: one scale per dim-1 entry
    assert y.dtype == store and y.shape == x.shape
    for (b, c, k), v in zip(torch.cartesian_prod(*map(torch.arange, x.shape)).tolist(), x.flatten().tolist()):
        expected = sat(round(v / scales[c].item() + zp[c].item()), lo, hi)
        assert abs(y[b, c, k].item() - expected) <= (1 if dtype == torch.qint32 else 0)


def test_quantize_mul_mode_last_axis_and_int4_packing():
    x = torch.randn(2, 16)
    scales = torch.rand(16) * 10
    y = Q.npu_quantize(x, scales, None, torch.quint4x2, 5, False)   # axis > -2 means the last axis
    assert (y.dtype, y.shape) == (torch.int32, (2, 2))
    for r in range(2):
        values = [sat(round(x[r, j].item() * scales[j].item()), -8, 7) for j in range(16)]
        assert y[r].tolist() == [nibble_word(values[:8]), nibble_word(values[8:])]


def test_quantize_mul_mode_axis_minus_two():
    x = torch.randn(3, 4)
    scales = torch.tensor([10.0, 20.0, 30.0])
    y = Q.npu_quantize(x, scales, None, torch.qint8, -2, False)
    assert y.tolist() == [[sat(round(x[i, j].item() * scales[i].item()), -128, 127) for j in range(4)] for i in range(3)]


def test_quantize_int4_needs_last_dim_divisible_by_8_and_meta():
    with pytest.raises(RuntimeError, match="If dtype is quint4x2, the last dim of input must be divided by 8"):
        Q.npu_quantize(torch.randn(2, 12), torch.ones(12), None, torch.quint4x2, -1, False)
    x = torch.empty(2, 3, 16, device="meta")
    assert Q._quantize_meta(x, x, None, 16).shape == (2, 3, 2)
    assert Q._quantize_meta(x, x, None, 13).dtype == torch.uint8
    assert Q._quantize_meta(x, x, None, 12).dtype == torch.int8


# ============================================================================ npu_anti_quant
def test_anti_quant_int8_and_packed_int4():
    x = torch.randint(-128, 127, (3, 8), dtype=torch.int8)
    scale, offset = torch.rand(8), torch.randn(8)
    y = Q.npu_anti_quant(x, scale, offset=offset, dst_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    expected = [[(x[i, j].item() + offset[j].item()) * scale[j].item() for j in range(8)] for i in range(3)]
    torch.testing.assert_close(y.float(), torch.tensor(expected), rtol=1e-2, atol=1e-2)
    values = [[-8, 7, 0, 1, -1, 3, -3, 5], [2, 2, -4, 6, -7, 0, 1, -2]]
    packed = torch.tensor([[nibble_word(values[0])], [nibble_word(values[1])]], dtype=torch.int32)
    y4 = Q.npu_anti_quant(packed, torch.tensor([0.5]))
    assert (y4.dtype, y4.shape) == (torch.float16, (2, 8))
    assert y4.tolist() == [[v * 0.5 for v in row] for row in values]


def test_anti_quant_errors_and_meta():
    with pytest.raises(RuntimeError, match="scale_dtype and offset_dtype is only support float32"):
        Q.npu_anti_quant(torch.zeros(4, dtype=torch.float8_e4m3fn), torch.ones(1, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="Not supported for x is scalar when x dtype is int32"):
        Q._anti_quant_meta(torch.empty((), dtype=torch.int32, device="meta"), torch.empty(1, device="meta"))
    assert Q._anti_quant_meta(torch.empty(2, 3, dtype=torch.int32, device="meta"),
                              torch.empty(1, device="meta")).shape == (2, 24)


# ============================================================================ npu_dynamic_quant_asymmetric
def test_dynamic_quant_asymmetric_int8_per_row():
    x = torch.randn(2, 3, 8, dtype=torch.float16)
    y, scale, offset = Q.npu_dynamic_quant_asymmetric(x)
    assert (y.dtype, scale.shape, offset.shape) == (torch.int8, (2, 3), (2, 3))
    for r, row in enumerate(x.float().reshape(-1, 8).tolist()):
        s = (max(row) - min(row)) / 255.0
        o = 127 - max(row) / s
        assert scale.reshape(-1)[r].item() == pytest.approx(s, rel=1e-5)
        assert offset.reshape(-1)[r].item() == pytest.approx(o, rel=1e-4, abs=1e-4)
        assert y.reshape(-1, 8)[r].tolist() == [sat(round(v / s + o), -128, 127) for v in row]
    assert y.reshape(-1, 8).amax(dim=-1).tolist() == [127] * 6


def test_dynamic_quant_asymmetric_moe_groups_and_int4():
    x = torch.randn(4, 8)
    smooth = torch.rand(2, 8) + 0.5
    group_index = torch.tensor([1, 4], dtype=torch.int32)           # row 0 -> smooth[0], rows 1..3 -> smooth[1]
    y, scale, offset = Q.npu_dynamic_quant_asymmetric(x, smooth_scales=smooth, group_index=group_index,
                                                      dst_type=torch.quint4x2)
    assert (y.dtype, y.shape) == (torch.int32, (4, 1))
    for r in range(4):
        row = [v * s for v, s in zip(x[r].tolist(), smooth[0 if r == 0 else 1].tolist())]
        s = (max(row) - min(row)) / 15.0
        o = 7 - max(row) / s
        assert y[r, 0].item() == nibble_word([sat(round(v / s + o), -8, 7) for v in row])
        assert scale[r].item() == pytest.approx(s, rel=1e-5)


def test_dynamic_quant_asymmetric_meta_and_errors():
    x = torch.empty(2, 5, 16, device="meta", dtype=torch.float16)
    y, s, o = Q._dynamic_quant_asymmetric_meta(x, dst_type=16)
    assert (tuple(y.shape), tuple(s.shape), tuple(o.shape)) == ((2, 5, 2), (2, 5), (2, 5))
    assert tuple(Q._dynamic_quant_asymmetric_meta(x, quant_mode="perchannel")[1].shape) == (2, 16)
    assert tuple(Q._dynamic_quant_asymmetric_meta(x, quant_mode="pertensor")[2].shape) == (1,)
    with pytest.raises(RuntimeError, match="If dst_dtype is quint4x2, the last dim of input must be divisible by 8"):
        Q.npu_dynamic_quant_asymmetric(torch.randn(2, 12), dst_type=torch.quint4x2)


# ============================================================================ npu_weight_quant_batchmatmul
def test_weight_quant_batchmatmul_per_channel_int8():
    x = torch.randn(3, 6, dtype=torch.float16)
    w = torch.randint(-8, 8, (6, 4), dtype=torch.int8)
    scale, offset, bias = torch.rand(1, 4, dtype=torch.float16), torch.randn(1, 4, dtype=torch.float16), torch.randn(4)
    y = Q.npu_weight_quant_batchmatmul(x, w, scale, offset, bias=bias)
    assert (y.dtype, y.shape) == (torch.float16, (3, 4))
    xs, ws = x.float().tolist(), w.tolist()
    for i in range(3):
        for j in range(4):
            acc = sum(xs[i][k] * (ws[k][j] + offset[0, j].item()) * scale[0, j].item() for k in range(6))
            assert y[i, j].item() == pytest.approx(acc + bias[j].item(), rel=2e-2, abs=2e-2)


def test_weight_quant_batchmatmul_per_group_and_int8_output():
    x = torch.randn(2, 64)
    w = torch.randint(-8, 8, (64, 3), dtype=torch.int8)
    scale = torch.rand(2, 3)                        # ceil(64 / 32) groups along K
    quant_scale, quant_offset = torch.tensor([2.0, 3.0, 4.0]), torch.tensor([1.0, 0.0, -1.0])
    y = Q.npu_weight_quant_batchmatmul(x, w, scale, quant_scale=quant_scale, quant_offset=quant_offset,
                                       antiquant_group_size=32)
    assert y.dtype == torch.int8
    for i in range(2):
        for j in range(3):
            acc = sum(x[i, k].item() * w[k, j].item() * scale[k // 32, j].item() for k in range(64))
            assert abs(y[i, j].item() - sat(round(acc * quant_scale[j].item() + quant_offset[j].item()), -128, 127)) <= 1


def test_weight_quant_batchmatmul_int4_weight_packed_along_n_or_k():
    x = torch.randn(2, 16)
    values = torch.randint(-8, 8, (16, 8))                                                             # (K, N)
    along_n = torch.tensor([[nibble_word(values[k].tolist())] for k in range(16)], dtype=torch.int32)  # (K, N/8)
    along_k = torch.tensor([[nibble_word(values[:8, n].tolist()), nibble_word(values[8:, n].tolist())]
                            for n in range(8)], dtype=torch.int32)                                     # (N, K/8)
    expected = x @ values.float()
    for weight in (along_n, along_k.t()):
        y = Q.npu_weight_quant_batchmatmul(x, weight, torch.ones(1))
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    meta = Q._weight_quant_batchmatmul_meta(x.to("meta"), along_n.to("meta"), torch.empty(1, device="meta"))
    assert meta.shape == (2, 8)


# ============================================================================ npu_dequant_swiglu_quant
def test_dequant_swiglu_quant_dynamic_with_groups():
    x = torch.randint(-50, 50, (5, 8), dtype=torch.int32)
    weight_scale = torch.rand(2, 8) * 0.1
    activation_scale = torch.rand(5) + 0.5
    quant_scale = torch.rand(2, 4) + 0.5
    group_index = torch.tensor([1, 3], dtype=torch.int64)          # counts: row 0 -> g0, rows 1..3 -> g1, row 4 unset
    y, scale = Q.npu_dequant_swiglu_quant(x, weight_scale=weight_scale, activation_scale=activation_scale,
                                          quant_scale=quant_scale, group_index=group_index, activate_left=True,
                                          quant_mode=1)
    assert (y.shape, y.dtype, scale.shape) == ((5, 4), torch.int8, (5,))
    silu = lambda v: v / (1 + torch.exp(torch.tensor(-v)).item())  # noqa: E731
    for r in range(4):
        g = 0 if r == 0 else 1
        v = [x[r, j].item() * weight_scale[g, j].item() * activation_scale[r].item() for j in range(8)]
        t = [silu(v[j]) * v[j + 4] * quant_scale[g, j].item() for j in range(4)]
        s = max(abs(e) for e in t) / 127
        assert scale[r].item() == pytest.approx(s, rel=1e-4)
        assert y[r].tolist() == [sat(round(e / s), -128, 127) for e in t]
    assert y[4].tolist() == [0] * 4


def test_dequant_swiglu_quant_right_activation_and_variant():
    x = torch.randn(3, 8)
    y, scale = Q.npu_dequant_swiglu_quant(x, quant_mode=1)                       # silu(second half) * first half
    a, b = x[:, :4], x[:, 4:]
    t = torch.nn.functional.silu(b) * a
    torch.testing.assert_close(scale, t.abs().amax(-1) / 127)
    y2, scale2 = Q.npu_dequant_swiglu_quant(x, quant_mode=1, swiglu_mode=1, clamp_limit=0.5, glu_alpha=1.5,
                                            glu_bias=0.25)
    gate, lin = x[:, 0::2].clamp(max=0.5), x[:, 1::2].clamp(-0.5, 0.5)
    t2 = [[g * (1 / (1 + torch.exp(torch.tensor(-1.5 * g)).item())) * (li + 0.25)
           for g, li in zip(gr, lr)] for gr, lr in zip(gate.tolist(), lin.tolist())]
    torch.testing.assert_close(scale2, torch.tensor([max(abs(v) for v in row) / 127 for row in t2]))


def test_dequant_swiglu_quant_argument_errors_and_meta():
    with pytest.raises(RuntimeError, match="weight_scale is required when x is int32"):
        Q.npu_dequant_swiglu_quant(torch.zeros(2, 4, dtype=torch.int32), quant_mode=1)
    with pytest.raises(RuntimeError, match="must be None when x is float16 or bfloat16"):
        Q.npu_dequant_swiglu_quant(torch.zeros(2, 4), weight_scale=torch.ones(4), quant_mode=1)
    with pytest.raises(NotImplementedError, match=re.escape("static quantisation (quant_mode=0)")):
        Q.npu_dequant_swiglu_quant(torch.zeros(2, 4))
    y, s = Q._dequant_swiglu_quant_meta(torch.empty(6, 10, device="meta", dtype=torch.int32))
    assert (tuple(y.shape), y.dtype, tuple(s.shape)) == ((6, 5), torch.int8, (6,))
