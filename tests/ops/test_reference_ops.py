"""CPU reference ops against independent, deliberately naive computations.

Each expected value is written differently from the implementation (explicit loops, scalar
formulas, hand-derived tables) so a shared misconception cannot make both agree.  Shapes and
dtypes are checked against the meta rules of torch_npu 2.14.0; error paths against the exact
message heads of its meta kernels.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from pytest_npugraph.runtime.ops import _common, attention, gmm, layout, mc2, moe, norms, quant

INT8, INT32, FP16, BF16, FP32, QUINT4X2 = 1, 3, 5, 15, 6, 16  # ScalarType numbers torch_npu takes


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def raises(pattern: str, exc=RuntimeError):
    return pytest.raises(exc, match=re.escape(pattern))


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual.to(torch.float64), torch.as_tensor(expected, dtype=torch.float64),
                               atol=tol, rtol=tol)


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# ============================================================================ swiglu / norms / rope
@pytest.mark.parametrize("dim", [-1, 1])
def test_swiglu_matches_scalar_formula(dim):
    x = torch.randn(2, 6, 4)
    y = norms.npu_swiglu(x, dim=dim)
    half = x.size(dim) // 2
    xm = x.movedim(dim, -1)
    expected = torch.empty(*xm.shape[:-1], half)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in xm.shape[:-1]]):
        row = xm[tuple(idx)]
        for j in range(half):
            a, b = float(row[j]), float(row[j + half])
            expected[tuple(idx) + (j,)] = a * sigmoid(a) * b
    close(y, expected.movedim(-1, dim))


def test_swiglu_meta_floor_half_and_dtype():
    y = norms.npu_swiglu(torch.randn(3, 7, dtype=torch.bfloat16))
    assert y.shape == (3, 3) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("gamma_shape", [(8,), (3, 8)])
def test_rms_norm_rows_and_rstd_shape(gamma_shape):
    x = torch.randn(2, 3, 8, dtype=torch.float16)
    gamma = torch.randn(gamma_shape, dtype=torch.float16)
    y, rstd = norms.npu_rms_norm(x, gamma, epsilon=1e-5)
    g = gamma.dim()
    assert y.dtype == torch.float16 and rstd.dtype == torch.float32
    assert rstd.shape == x.shape[:x.dim() - g] + (1,) * g
    flat = x.float().reshape(-1, gamma.numel())
    for r in range(flat.size(0)):
        values = flat[r].tolist()
        inv = 1.0 / math.sqrt(sum(v * v for v in values) / len(values) + 1e-5)
        close(rstd.reshape(-1)[r], inv, tol=1e-4)
        close(y.reshape(-1, gamma.numel())[r], [v * inv * float(w) for v, w in zip(values, gamma.float().reshape(-1))],
              tol=2e-2)


def test_add_rms_norm_returns_norm_rstd_and_sum():
    x1, x2, gamma = torch.randn(4, 16), torch.randn(4, 16), torch.rand(16)
    y, rstd, x = norms.npu_add_rms_norm(x1, x2, gamma)
    total = x1 + x2
    close(x, total)
    expected_rstd = 1 / (total.pow(2).sum(-1, keepdim=True) / 16 + 1e-6).sqrt()
    close(rstd, expected_rstd, tol=1e-5)
    close(y, total * expected_rstd * gamma, tol=1e-5)
    assert rstd.shape == (4, 1) and rstd.dtype == torch.float32


def _rope_expected(x, cos, sin, mode):
    out = torch.empty_like(x)
    d = x.size(-1)
    for j in range(d):
        if mode == "half":
            partner = -x[..., j + d // 2] if j < d // 2 else x[..., j - d // 2]
        else:
            partner = -x[..., j + 1] if j % 2 == 0 else x[..., j - 1]
        out[..., j] = cos[..., j] * x[..., j] + sin[..., j] * partner
    return out


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_modes_with_broadcast_cos_sin(mode):
    x = torch.randn(2, 3, 5, 8)          # BNSD
    cos, sin = torch.rand(1, 1, 5, 8), torch.rand(1, 1, 5, 8)
    out = attention.npu_rotary_mul(x, cos, sin, mode)
    close(out, _rope_expected(x, cos.expand_as(x), sin.expand_as(x), mode))
    assert out.shape == x.shape and out.dtype == x.dtype


def test_rotary_mul_rotate_matrix_reproduces_half_mode():
    n = 8
    rotate = torch.zeros(n, n)  # the docstring's construction for half mode
    rotate[:n // 2, n // 2:] = torch.eye(n // 2)
    rotate[n // 2:, :n // 2] = -torch.eye(n // 2)
    x, cos, sin = torch.randn(1, 2, 3, n, dtype=torch.bfloat16), torch.rand(1, 1, 3, n), torch.rand(1, 1, 3, n)
    out = attention.npu_rotary_mul(x, cos, sin, "half", rotate)
    assert out.dtype == torch.bfloat16
    close(out, _rope_expected(x.float(), cos.expand(1, 2, 3, n), sin.expand(1, 2, 3, n), "half"), tol=2e-2)


def test_rotary_mul_rejects_bad_rank_and_mode():
    with raises("input must be 4-D"):
        attention.npu_rotary_mul(torch.randn(3, 8), torch.rand(3, 8), torch.rand(3, 8))
    with raises("rotary_mode only supports"):
        attention.npu_rotary_mul(torch.randn(1, 1, 3, 8), torch.rand(1, 1, 3, 8), torch.rand(1, 1, 3, 8), "quarter")


# ============================================================================ dynamic quant
def _check_symmetric_int8(y, scale, xs, bound=127):
    """Every value is within half a step of x/scale, and the row max hits the bound."""
    for r in range(xs.size(0)):
        s = max(abs(v) for v in xs[r].tolist()) / bound
        close(scale[r], s, tol=1e-6)
        for q, v in zip(y[r].tolist(), xs[r].tolist()):
            assert abs(q - v / s) <= 0.5 + 1e-4 and -bound - 1 <= q <= bound


def test_dynamic_quant_pertoken_int8():
    x = torch.randn(2, 3, 16, dtype=torch.float16)
    y, scale = quant.npu_dynamic_quant(x)
    assert y.dtype == torch.int8 and y.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == (2, 3)
    _check_symmetric_int8(y.reshape(6, 16), scale.reshape(6), x.float().reshape(6, 16))


def test_dynamic_quant_smooth_scales_and_group_index():
    x = torch.randn(5, 8)
    smooth = torch.rand(8) + 0.5
    y, scale = quant.npu_dynamic_quant(x, smooth_scales=smooth)
    _check_symmetric_int8(y, scale, x * smooth)
    groups = torch.rand(2, 8) + 0.5
    y, scale = quant.npu_dynamic_quant(x, smooth_scales=groups, group_index=torch.tensor([2, 5], dtype=torch.int32))
    rows = torch.stack([x[r] * groups[0 if r < 2 else 1] for r in range(5)])
    _check_symmetric_int8(y, scale, rows)


def test_dynamic_quant_quint4x2_packs_eight_int4_per_int32():
    x = torch.randn(3, 16)
    packed, scale = quant.npu_dynamic_quant(x, dst_type=QUINT4X2)
    assert packed.dtype == torch.int32 and packed.shape == (3, 2) and scale.shape == (3,)
    values = torch.empty(3, 16)
    for r in range(3):
        for w in range(2):
            word = int(packed[r, w]) & 0xFFFFFFFF
            for j in range(8):
                nibble = (word >> (4 * j)) & 0xF
                values[r, w * 8 + j] = nibble - 16 if nibble >= 8 else nibble
    _check_symmetric_int8(values, scale, x, bound=7)


def test_dynamic_quant_quint4x2_needs_last_dim_multiple_of_8():
    with raises("If dst_dtype is quint4x2, the last dim of input must be divisible by 8"):
        quant.npu_dynamic_quant(torch.randn(2, 12), dst_type=QUINT4X2)


def test_dynamic_quant_pertensor_and_perchannel_scale_shapes():
    x = torch.randn(2, 4, 8)
    y, scale = quant.npu_dynamic_quant(x, quant_mode="pertensor")
    assert scale.shape == (1,)
    close(scale, [x.abs().max() / 127])
    y, scale = quant.npu_dynamic_quant(x, quant_mode="perchannel")
    assert scale.shape == (2, 8)
    close(scale[1, 3], max(abs(float(x[1, t, 3])) for t in range(4)) / 127)
    assert y.shape == x.shape


def test_pack_unpack_int4_roundtrip():
    values = torch.randint(-8, 8, (4, 24), dtype=torch.int8)
    assert torch.equal(_common.unpack_int4(_common.pack_int4(values)), values)


# ============================================================================ quant matmul
def _int_matmul(a, b):
    return [[sum(int(a[i, t]) * int(b[t, j]) for t in range(a.size(1))) for j in range(b.size(1))]
            for i in range(a.size(0))]


def test_quant_matmul_pertoken_bf16_output():
    x1, x2 = torch.randint(-8, 8, (3, 16), dtype=torch.int8), torch.randint(-8, 8, (16, 5), dtype=torch.int8)
    scale, pertoken = torch.rand(5), torch.rand(3)
    bias = torch.randint(-20, 20, (5,), dtype=torch.int32)
    y = quant.npu_quant_matmul(x1, x2, scale, pertoken_scale=pertoken, bias=bias, output_dtype=BF16)
    acc = _int_matmul(x1, x2)
    expected = [[(acc[i][j] + int(bias[j])) * float(scale[j]) * float(pertoken[i]) for j in range(5)] for i in range(3)]
    assert y.dtype == torch.bfloat16 and y.shape == (3, 5)
    close(y, expected, tol=2e-2)


def test_quant_matmul_int8_output_with_offset_and_int64_scale():
    x1, x2 = torch.randint(-4, 4, (2, 8), dtype=torch.int8), torch.randint(-4, 4, (8, 3), dtype=torch.int8)
    scale_f = torch.tensor([0.05, -0.1, 0.2])  # a negative scale sets bit 31 of the packed word
    packed_scale = scale_f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # npu_trans_quant_param layout
    offset = torch.tensor([1.0, -2.0, 0.5])
    y = quant.npu_quant_matmul(x1, x2, packed_scale, offset=offset)
    acc = _int_matmul(x1, x2)
    expected = [[max(-128, min(127, round(acc[i][j] * float(scale_f[j]) + float(offset[j])))) for j in range(3)]
                for i in range(2)]
    assert y.dtype == torch.int8
    assert y.tolist() == expected


def test_quant_matmul_int32_output_is_raw_accumulator_and_batch_broadcast():
    x1 = torch.randint(-8, 8, (1, 2, 4), dtype=torch.int8)
    x2 = torch.randint(-8, 8, (3, 4, 5), dtype=torch.int8)
    y = quant.npu_quant_matmul(x1, x2, torch.rand(1), output_dtype=INT32)
    assert y.shape == (3, 2, 5) and y.dtype == torch.int32
    for b in range(3):
        assert y[b].tolist() == _int_matmul(x1[0], x2[b])


def test_quant_matmul_int4_packed_operands():
    a = torch.randint(-8, 8, (2, 16))
    b = torch.randint(-8, 8, (16, 8))

    def pack_rows(m):  # eight signed nibbles per int32, element j in bits 4j..4j+3
        words = []
        for row in m.tolist():
            out = []
            for c in range(0, len(row), 8):
                word = sum((v & 0xF) << (4 * j) for j, v in enumerate(row[c:c + 8]))
                out.append(word - 2 ** 32 if word >= 2 ** 31 else word)
            words.append(out)
        return torch.tensor(words, dtype=torch.int32)

    scale = torch.rand(8)
    y = quant.npu_quant_matmul(pack_rows(a), pack_rows(b), scale, output_dtype=FP16)
    assert y.shape == (2, 8) and y.dtype == torch.float16
    close(y, torch.tensor(_int_matmul(a, b)) * scale, tol=2e-2)
    y_t = quant.npu_quant_matmul(pack_rows(a), pack_rows(b.T).T, scale, output_dtype=FP16)  # (k/8, n) transposed view
    close(y_t, y)


def test_quant_matmul_errors():
    x1, x2 = torch.ones(2, 8, dtype=torch.int8), torch.ones(6, 4, dtype=torch.int8)
    with raises("k dim of x1 and x2 need be same, please check k dim of x1 and x2"):
        quant.npu_quant_matmul(x1, x2, torch.ones(4))
    x2 = torch.ones(8, 4, dtype=torch.int8)
    with raises("the scale dim num must be 1, please check scale dim num"):
        quant.npu_quant_matmul(x1, x2, torch.ones(1, 4))
    with raises("the scale 1st dim value must be 1 or x2 n dim value,"):
        quant.npu_quant_matmul(x1, x2, torch.ones(3))
    with raises("Not supported output dtype is torch.int64"):
        quant.npu_quant_matmul(x1, x2, torch.ones(4), output_dtype=4)
    with raises("When scale's dtype is bfloat16, output_dtype must be bfloat16 or int32, but output_dtype is None"):
        quant.npu_quant_matmul(x1, x2, torch.ones(4, dtype=torch.bfloat16))
    with raises("x1 dim num should be 2 ~ 6"):
        quant.npu_quant_matmul(torch.ones(8, dtype=torch.int8), x2, torch.ones(4))


# ============================================================================ grouped matmul
def _mm(a, b):
    return torch.tensor([[sum(float(a[i, t]) * float(b[t, j]) for t in range(a.size(1))) for j in range(b.size(1))]
                         for i in range(a.size(0))])


def test_gmm_multi_x_multi_weight_with_bias():
    x = [torch.randn(3, 4), torch.randn(2, 5), torch.randn(4, 3)]
    w = [torch.randn(4, 6), torch.randn(5, 2), torch.randn(3, 3)]
    b = [torch.randn(6), torch.randn(2), torch.randn(3)]
    ys = gmm.npu_grouped_matmul(x, w, bias=b, group_type=-1)
    assert [y.shape for y in ys] == [(3, 6), (2, 2), (4, 3)]
    for xi, wi, bi, yi in zip(x, w, b, ys):
        close(yi, _mm(xi, wi) + bi, tol=1e-4)


@pytest.mark.parametrize("group_list_type, group_list", [(0, [2, 2, 6]), (1, [2, 0, 4])])
def test_gmm_single_x_3d_weight_grouped_rows(group_list_type, group_list):
    x, w = torch.randn(6, 4), torch.randn(3, 4, 5)
    (y,) = gmm.npu_grouped_matmul([x], [w], group_list=torch.tensor(group_list), split_item=3, group_type=0,
                                group_list_type=group_list_type)
    owner = [0, 0, 2, 2, 2, 2]  # group 1 is empty in both encodings
    assert y.shape == (6, 5) and y.dtype == x.dtype
    for r in range(6):
        close(y[r], _mm(x[r:r + 1], w[owner[r]])[0], tol=1e-4)


def test_gmm_split_item_1_returns_one_output_per_group_and_0_one_per_x():
    x, w = torch.randn(5, 3), [torch.randn(3, 4), torch.randn(3, 4)]
    parts = gmm.npu_grouped_matmul([x], w, group_list=torch.tensor([2, 5]), split_item=1, group_type=0)
    assert [p.shape for p in parts] == [(2, 4), (3, 4)]
    close(parts[1], _mm(x[2:], w[1]), tol=1e-4)
    whole = gmm.npu_grouped_matmul([x], w, group_list=torch.tensor([2, 5]), split_item=0, group_type=0)
    assert len(whole) == 1
    close(whole[0], torch.cat(parts))


def test_gmm_multi_x_concatenated_output():
    x, w = [torch.randn(2, 3), torch.randn(3, 3)], [torch.randn(3, 4), torch.randn(3, 4)]
    (y,) = gmm.npu_grouped_matmul(x, w, split_item=2, group_type=0, group_list=torch.tensor([2, 5]))
    close(y, torch.cat([_mm(x[0], w[0]), _mm(x[1], w[1])]), tol=1e-4)


def test_gmm_k_axis_grouping():
    x, w = torch.randn(3, 6), torch.randn(6, 2)
    (y,) = gmm.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 6]), split_item=3, group_type=2)
    assert y.shape == (2, 3, 2)
    close(y[0], _mm(x[:, :2], w[:2]), tol=1e-4)
    close(y[1], _mm(x[:, 2:], w[2:]), tol=1e-4)


@pytest.mark.parametrize("act_type, fn", [
    (1, lambda v: max(v, 0.0)),
    (2, lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))),
    (4, lambda v: v / (1 + math.exp(-1.702 * abs(v))) * math.exp(0.851 * (v - abs(v)))),  # Ascend FastGelu
    (5, lambda v: v / (1 + math.exp(-v))),
])
def test_gmm_activations(act_type, fn):
    x, w = torch.randn(4, 3), torch.randn(1, 3, 5)
    (y,) = gmm.npu_grouped_matmul([x], [w], group_list=torch.tensor([4]), split_item=3, group_type=0, act_type=act_type)
    plain = _mm(x, w[0])
    close(y, [[fn(float(v)) for v in row] for row in plain], tol=1e-4)


def test_gmm_pertoken_quant_and_antiquant_forms():
    x = torch.randint(-8, 8, (4, 8), dtype=torch.int8)
    w = torch.randint(-8, 8, (2, 8, 3), dtype=torch.int8)
    scale, pts = torch.rand(2, 3), torch.rand(4)
    (y,) = gmm.npu_grouped_matmul([x], [w], scale=[scale], per_token_scale=[pts], group_list=torch.tensor([1, 4]),
                                split_item=3, group_type=0, output_dtype=BF16)
    assert y.dtype == torch.bfloat16
    for r in range(4):
        g = 0 if r < 1 else 1
        acc = _int_matmul(x[r:r + 1], w[g])[0]
        close(y[r], [acc[j] * float(scale[g, j]) * float(pts[r]) for j in range(3)], tol=3e-2)
    xf = torch.randn(3, 8, dtype=torch.float16)
    wq = torch.randint(-8, 8, (8, 2), dtype=torch.int8)
    a_scale, a_offset = torch.rand(2, dtype=torch.float16), torch.rand(2, dtype=torch.float16)
    (y,) = gmm.npu_grouped_matmul([xf], [wq], antiquant_scale=[a_scale], antiquant_offset=[a_offset], group_type=-1)
    dequant = (wq.float() + a_offset.float()) * a_scale.float()
    assert y.dtype == torch.float16
    close(y, _mm(xf.float(), dequant), tol=2e-2)


def test_gmm_list_overload_cumulative_list_and_dtype():
    x, w = torch.randn(4, 3), [torch.randn(3, 2), torch.randn(3, 2)]
    (y,) = gmm.npu_grouped_matmul_list([x], w, group_list=[1, 4], split_item=2, output_dtype=torch.float32)
    close(y, torch.cat([_mm(x[:1], w[0]), _mm(x[1:], w[1])]), tol=1e-4)


def test_gmm_errors():
    x, w = [torch.randn(2, 3)], [torch.randn(3, 4)]
    with raises("group_type only supports -1, 0 and 2, but got None"):
        gmm.npu_grouped_matmul(x, w)
    with raises("group_type only supports -1, 0 and 2, but got 1"):
        gmm.npu_grouped_matmul(x, w, group_type=1)
    with pytest.raises(RuntimeError, match="is not supported for now"):
        gmm.npu_grouped_matmul(x, w, group_type=-1, output_dtype=INT8)
    with raises("The number of x and weight should be greater than 0, but they are 0and 1."):
        gmm.npu_grouped_matmul([], w, group_type=-1)
    with raises("act_type 3 is not supported"):
        gmm.npu_grouped_matmul(x, w, group_type=-1, act_type=3)


# ============================================================================ MoE gating
def test_gating_top_k_softmax_values_indices_row_idx():
    x = torch.randn(4, 6)
    y, idx, row = moe.npu_moe_gating_top_k_softmax(x, k=2)
    assert y.shape == idx.shape == row.shape == (4, 2)
    assert idx.dtype == row.dtype == torch.int32 and y.dtype == x.dtype
    for i in range(4):
        exps = [math.exp(v) for v in x[i].tolist()]
        probs = [e / sum(exps) for e in exps]
        order = sorted(range(6), key=lambda e: -probs[e])[:2]
        assert idx[i].tolist() == order
        close(y[i], [probs[e] for e in order])
        assert row[i].tolist() == [j * 4 + i for j in range(2)]


def test_gating_top_k_softmax_3d_and_finished_rows():
    x = torch.randn(2, 3, 5)
    finished = torch.tensor([[False, True, False], [False, False, True]])
    y, idx, row = moe.npu_moe_gating_top_k_softmax(x, finished, k=3)
    assert y.shape == (2, 3, 3)
    assert (idx[0, 1] == 5).all() and (idx[1, 2] == 5).all() and (idx[0, 0] < 5).all()
    assert row[1, 0].tolist() == [3, 9, 15]  # flattened row 3 of 6
    with raises("the x shape support only 2d and 3d)"):
        moe.npu_moe_gating_top_k_softmax(torch.randn(5), k=1)


def _gating_reference(x, k, bias, k_group, group_count, mode, norm_type, factor, eps=1e-20):
    """Per-token, plain-Python steps 1-6 of aclnnMoeGatingTopK."""
    ys, ids = [], []
    for row in x.tolist():
        if norm_type == 0:
            exps = [math.exp(v) for v in row]
            norm = [e / sum(exps) for e in exps]
        else:
            norm = [sigmoid(v) for v in row]
        score = [n + (float(bias[e]) if bias is not None else 0.0) for e, n in enumerate(norm)]
        size = len(row) // group_count
        group_scores = []
        for g in range(group_count):
            members = sorted(score[g * size:(g + 1) * size], reverse=True)
            group_scores.append(members[0] if mode == 0 else members[0] + members[1])
        chosen = sorted(range(group_count), key=lambda g: -group_scores[g])[:k_group]
        candidates = [e for e in range(len(row)) if e // size in chosen]
        top = sorted(candidates, key=lambda e: -score[e])[:k]
        total = sum(norm[e] for e in top)
        ys.append([norm[e] / (total + eps) * factor for e in top])
        ids.append(top)
    return ys, ids


@pytest.mark.parametrize("norm_type, mode, use_bias", [(0, 0, False), (1, 0, True), (1, 1, True)])
def test_gating_top_k_grouped_selection(norm_type, mode, use_bias):
    x = torch.randn(6, 32)
    bias = torch.randn(32) * 0.3 if use_bias else None
    y, idx, norm = moe.npu_moe_gating_top_k(x, 3, bias=bias, k_group=2, group_count=8, group_select_mode=mode,
                                          norm_type=norm_type, routed_scaling_factor=2.5)
    ys, ids = _gating_reference(x, 3, bias, 2, 8, mode, norm_type, 2.5)
    assert idx.tolist() == ids and idx.dtype == torch.int32
    close(y, ys, tol=1e-5)
    assert norm.shape == (6, 32) and norm.dtype == torch.float32
    close(norm, torch.softmax(x, -1) if norm_type == 0 else torch.sigmoid(x))


def test_gating_top_k_hash_mode_and_errors():
    x = torch.randn(3, 8)
    table = torch.tensor([[1, 2], [3, 4], [5, 6], [0, 7]], dtype=torch.int32)
    y, idx, _ = moe.npu_moe_gating_top_k(x, 2, input_ids=torch.tensor([3, 0, 2]), tid2eid=table, norm_type=1)
    assert idx.tolist() == [[0, 7], [1, 2], [5, 6]]
    close(y.sum(-1), torch.ones(3))
    with raises("the x shape support only 2d)"):
        moe.npu_moe_gating_top_k(torch.randn(2, 3, 8), 2)
    with raises("the bias shape support only 1d)"):
        moe.npu_moe_gating_top_k(x, 2, bias=torch.randn(1, 8))
    with raises("input_ids and tid2eid must be both provided or both omitted)"):
        moe.npu_moe_gating_top_k(x, 2, input_ids=torch.tensor([0, 1, 2]))
    with raises("The tid2eid second dim should be same as k)"):
        moe.npu_moe_gating_top_k(x, 3, input_ids=torch.tensor([0, 1, 2]), tid2eid=table)


# ============================================================================ MoE routing
def test_init_routing_doc_example():
    x = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4])
    row_idx = torch.tensor([[0, 3], [1, 4], [2, 5]], dtype=torch.int32)
    expert_idx = torch.tensor([[1, 2], [0, 1], [0, 2]], dtype=torch.int32)
    expanded_x, expanded_row_idx, expanded_expert_idx = moe.npu_moe_init_routing(x, row_idx, expert_idx, 3)
    # hand-sorted: expert 0 <- pairs (1,0),(2,0); expert 1 <- (0,0),(1,1); expert 2 <- (0,1),(2,1)
    assert expanded_expert_idx.tolist() == [0, 0, 1, 1, 2, 2]
    assert expanded_row_idx.tolist() == [2, 0, 1, 4, 3, 5]
    close(expanded_x[:, 0], [0.2, 0.3, 0.1, 0.2, 0.1, 0.3])
    assert expanded_row_idx.dtype == expanded_expert_idx.dtype == torch.int32


def test_init_routing_active_num_limits_rows():
    x = torch.randn(5, 3)
    _, experts, row_idx = moe.npu_moe_gating_top_k_softmax(torch.randn(5, 4), k=2)
    expanded_x, expanded_row_idx, _ = moe.npu_moe_init_routing(x, row_idx, experts, active_num=2)
    assert expanded_x.shape == (4, 3) and expanded_row_idx.shape == (10,)
    for src, dst in enumerate(expanded_row_idx.tolist()):
        if dst < 4:
            close(expanded_x[dst], x[row_idx.reshape(-1).tolist().index(src) // 2])


def _v2_reference(expert_idx, start, end, limit):
    """(destination rows, their source pairs) of the dropless v2 routing, by explicit scan."""
    flat = expert_idx.reshape(-1).tolist()
    pairs = sorted((e, pos) for pos, e in enumerate(flat) if start <= e < end)
    return [pos for _, pos in pairs][:limit], [e for e, _ in pairs][:limit]


@pytest.mark.parametrize("row_idx_type", [0, 1])
def test_init_routing_v2_active_range_and_row_idx_types(row_idx_type):
    n, k, h = 4, 3, 5
    x, expert_idx = torch.randn(n, h), torch.randint(0, 8, (n, k), dtype=torch.int32)
    scale = torch.rand(n)
    out_x, out_row, counts, out_scale = moe.npu_moe_init_routing_v2(
        x, expert_idx, scale=scale, expert_num=8, active_expert_range=[2, 6], expert_tokens_num_type=1,
        expert_tokens_num_flag=True, row_idx_type=row_idx_type)
    sources, experts = _v2_reference(expert_idx, 2, 6, n * k)
    assert out_x.shape == (n * k, h) and out_row.shape == (n * k,) and counts.shape == (4,)
    assert counts.dtype == torch.int64 and out_scale.dtype == torch.float32
    for dst, src in enumerate(sources):
        close(out_x[dst], x[src // k])
        close(out_scale[dst], scale[src // k])
    if row_idx_type == 0:
        expected = [-1] * (n * k)
        for dst, src in enumerate(sources):
            expected[src] = dst
        assert out_row.tolist() == expected
    else:
        assert out_row[:len(sources)].tolist() == sources
    assert counts.tolist() == [experts.count(e) for e in range(2, 6)]


def test_init_routing_v2_count_encodings_and_active_num():
    x, expert_idx = torch.randn(3, 4), torch.tensor([[0, 3], [3, 1], [0, 3]], dtype=torch.int32)
    common = dict(expert_num=4, expert_tokens_num_flag=True)
    _, _, cumsum, _ = moe.npu_moe_init_routing_v2(x, expert_idx, expert_tokens_num_type=0, **common)
    assert cumsum.tolist() == [2, 3, 3, 6]
    _, _, pairs, _ = moe.npu_moe_init_routing_v2(x, expert_idx, expert_tokens_num_type=2, **common)
    assert pairs.tolist() == [[0, 2], [1, 1], [3, 3], [0, 0]]
    out_x, out_row, none, out_scale = moe.npu_moe_init_routing_v2(x, expert_idx, expert_num=4, active_num=4)
    assert out_x.shape == (4, 4) and none.shape == (0,) and out_scale.shape == (4,)
    assert sorted(d for d in out_row.tolist() if d >= 0) == [0, 1, 2, 3]  # pairs past active_num are dropped


def test_init_routing_v2_dynamic_quant_and_drop_pad():
    x, expert_idx = torch.randn(4, 8), torch.tensor([[0], [1], [0], [0]], dtype=torch.int32)
    smooth = torch.rand(2, 8) + 0.5
    out_x, _, _, out_scale = moe.npu_moe_init_routing_v2(x, expert_idx, scale=smooth, expert_num=2, quant_mode=1)
    assert out_x.dtype == torch.int8
    rows = torch.stack([x[0] * smooth[0], x[2] * smooth[0], x[3] * smooth[0], x[1] * smooth[1]])
    _check_symmetric_int8(out_x, out_scale, rows)
    padded, out_row, _, _ = moe.npu_moe_init_routing_v2(x, expert_idx, expert_num=2, expert_capacity=2,
                                                      drop_pad_mode=1)
    assert padded.shape == (2, 2, 8)
    close(padded[0], torch.stack([x[0], x[2]]))
    close(padded[1, 0], x[1])
    assert out_row.tolist() == [0, 2, 1, -1]  # token 3 exceeds expert 0's capacity
    _, gather_row, _, _ = moe.npu_moe_init_routing_v2(x, expert_idx, expert_num=2, expert_capacity=2, drop_pad_mode=1,
                                                    row_idx_type=1)
    assert gather_row.tolist() == [0, 2, 1, -1]  # sources of the kept rows, in expert order


def test_init_routing_v2_meta_errors():
    x, e = torch.randn(3, 4), torch.zeros(3, 2, dtype=torch.int32)
    cases = [
        ("the x shape support only 2d", dict(x=torch.randn(3), expert_idx=e)),
        ("the expert_idx shape support only 2d", dict(x=x, expert_idx=e.reshape(-1))),
        ("the first dim of expert_idx and x should be the same", dict(x=x, expert_idx=e[:2])),
        ("active_expert_range is invalid. must be increasing", dict(x=x, expert_idx=e, active_expert_range=[3, 1])),
        ("drop_pad_mode is None or invalid. must be in [0, 1]", dict(x=x, expert_idx=e, expert_num=2,
                                                                     drop_pad_mode=2)),
    ]
    for message, kwargs in cases:
        with raises(message):
            moe.npu_moe_init_routing_v2(**kwargs)


def test_finalize_routing_doc_formula():
    n, k, h, e = 5, 2, 3, 4
    rows, skip1, skip2 = torch.randn(n * k, h), torch.randn(n, h), torch.randn(n, h)
    bias, scales = torch.randn(e, h), torch.rand(n, k)
    src_to_dst = torch.randperm(n * k).to(torch.int32)
    experts = torch.randint(0, e, (n, k), dtype=torch.int32)
    out = moe.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, src_to_dst, experts, 0, k)
    for i in range(n):
        expected = skip1[i] + skip2[i]
        for j in range(k):
            expected = expected + scales[i, j] * (rows[int(src_to_dst[i + j * n])] + bias[int(experts[i, j])])
        close(out[i], expected)
    assert out.shape == (n, h)
    assert moe.npu_moe_finalize_routing(rows, None, None, None, None, src_to_dst, None, 0, k).shape == (n, h)


def test_routing_round_trips_through_finalize():
    """init_routing -> identity experts -> finalize gives sum_k w_k * x for both index orders."""
    x = torch.randn(6, 4)
    weights, experts, row_idx = moe.npu_moe_gating_top_k_softmax(torch.randn(6, 5), k=2)
    expanded, src_to_dst, _ = moe.npu_moe_init_routing(x, row_idx, experts, active_num=6)
    out = moe.npu_moe_finalize_routing(expanded, None, None, None, weights, src_to_dst, experts, 0, 2)
    close(out, x * weights.sum(-1, keepdim=True))
    expanded, src_to_dst, _, _ = moe.npu_moe_init_routing_v2(x, experts, expert_num=5)
    out = moe.npu_moe_finalize_routing(expanded, None, None, None, weights, src_to_dst, experts, 2, 2)
    close(out, x * weights.sum(-1, keepdim=True))


# ============================================================================ MC2 dispatch / combine (single rank)
def test_dispatch_groups_rows_by_expert_and_combine_inverts_it():
    n, k, h, e = 5, 2, 3, 4
    x = torch.randn(n, h)
    expert_ids = torch.stack([torch.randperm(e)[:k] for _ in range(n)]).to(torch.int32)
    weights = torch.rand(n, k)
    (expand_x, dyn_scales, expand_idx, token_nums, recv_counts, tp_counts,
     expand_scales) = mc2.npu_moe_distribute_dispatch(x, expert_ids, "ep", 1, 0, e, expert_scales=weights)
    assert expand_x.shape == (n * k, h) and dyn_scales.shape == (n * k,) and expand_idx.shape == (n * k,)
    assert token_nums.dtype == torch.int64 and token_nums.shape == (e,)
    assert recv_counts.dtype == torch.int32 and tp_counts.shape == (0,) and expand_scales.shape == (n * k,)
    row = 0
    for expert in range(e):
        senders = [(t, j) for t in range(n) for j in range(k) if int(expert_ids[t, j]) == expert]
        assert int(token_nums[expert]) == len(senders)
        for slot, (t, j) in enumerate(senders):
            close(expand_x[row], x[t])
            close(expand_scales[row], weights[t, j])
            assert int(expand_idx[t * k + j]) == slot
            row += 1
        assert int(recv_counts[expert]) == row  # prefix sums
    combined = mc2.npu_moe_distribute_combine(expand_x * 2, expert_ids, expand_idx, recv_counts, weights, "ep", 1, 0, e,
                                            shared_expert_x=torch.ones(n, h))
    close(combined, 2 * x * weights.sum(-1, keepdim=True) + 1)


def test_dispatch_active_mask_quant_and_cumsum_counts():
    x = torch.randn(4, 8)
    expert_ids = torch.tensor([[0], [1], [0], [1]], dtype=torch.int32)
    mask = torch.tensor([True, True, False, True])
    expand_x, scales, expand_idx, token_nums, recv, _, _ = mc2.npu_moe_distribute_dispatch(
        x, expert_ids, "ep", 1, 0, 2, x_active_mask=mask, quant_mode=2, expert_token_nums_type=0)
    assert expand_x.dtype == torch.int8 and token_nums.tolist() == [1, 3]
    _check_symmetric_int8(expand_x[:3], scales[:3], torch.stack([x[0], x[1], x[3]]))
    out = mc2.npu_moe_distribute_combine(expand_x.float() * scales.unsqueeze(1), expert_ids, expand_idx, recv,
                                       torch.ones(4, 1), "ep", 1, 0, 2, x_active_mask=mask)
    close(out[2], torch.zeros(8))
    close(out[[0, 1, 3]], x[[0, 1, 3]], tol=0.05)


def test_dispatch_combine_multi_rank_is_left_to_the_collectives_engine():
    with pytest.raises(NotImplementedError, match="npu_moe_distribute_dispatch.*ep_world_size=2"):
        mc2.npu_moe_distribute_dispatch(torch.randn(2, 4), torch.zeros(2, 1, dtype=torch.int32), "ep", 2, 0, 2)
    with pytest.raises(NotImplementedError, match="npu_moe_distribute_combine"):
        mc2.npu_moe_distribute_combine(torch.randn(2, 4), torch.zeros(2, 1, dtype=torch.int32),
                                     torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                     torch.ones(2, 1), "ep", 2, 0, 2)


# ============================================================================ fused infer attention
def naive_attention(q, k, v, scale, masked=lambda b, h, i, j: False, lengths_q=None, lengths_kv=None):
    """q (B, N, S, D), k/v (B, Nkv, Skv, D): explicit loops, returns (out, lse) with zeros/inf for dead rows."""
    bsz, heads, s_q, _ = q.shape
    group = heads // k.size(1)
    out = torch.zeros(bsz, heads, s_q, v.size(-1))
    lse = torch.zeros(bsz, heads, s_q)
    for b in range(bsz):
        lq = s_q if lengths_q is None else lengths_q[b]
        lkv = k.size(2) if lengths_kv is None else lengths_kv[b]
        for h in range(heads):
            kh, vh = k[b, h // group], v[b, h // group]
            for i in range(lq):
                keep = [j for j in range(lkv) if not masked(b, h, i, j)]
                if not keep:
                    lse[b, h, i] = math.inf
                    continue
                logits = [scale * float(q[b, h, i] @ kh[j]) for j in keep]
                top = max(logits)
                weights = [math.exp(s - top) for s in logits]
                total = sum(weights)
                lse[b, h, i] = top + math.log(total)
                out[b, h, i] = sum(w / total * vh[j] for w, j in zip(weights, keep))
    return out, lse


def test_fia_bsh_gqa_with_lse():
    b, s, skv, n, nkv, d = 2, 3, 4, 4, 2, 8
    q, k, v = torch.randn(b, s, n * d), torch.randn(b, skv, nkv * d), torch.randn(b, skv, nkv * d)
    out, lse = attention.npu_fused_infer_attention_score(q, k, v, num_heads=n, num_key_value_heads=nkv, scale=0.3,
                                                 input_layout="BSH", softmax_lse_flag=True)
    split = lambda t, heads: t.reshape(b, -1, heads, d).transpose(1, 2)  # noqa: E731
    exp_out, exp_lse = naive_attention(split(q, n), split(k, nkv), split(v, nkv), 0.3)
    assert out.shape == (b, s, n * d) and lse.shape == (b, n, s, 1) and lse.dtype == torch.float32
    close(out, exp_out.transpose(1, 2).reshape(b, s, n * d), tol=1e-4)
    close(lse[..., 0], exp_lse, tol=1e-4)


@pytest.mark.parametrize("layout", ["BSND", "BNSD", "BNSD_BSND", "BSND_BNSD", "BNSD_NBSD"])
def test_fia_layouts_are_permutations_of_the_same_math(layout):
    b, s, n, d = 2, 3, 2, 4
    q, k, v = (torch.randn(b, n, s, d) for _ in range(3))  # BNSD
    reference, _ = naive_attention(q, k, v, 0.5)
    q_layout, out_layout = (layout.split("_") + [layout])[:2]
    to = {"BNSD": lambda t: t, "BSND": lambda t: t.transpose(1, 2), "NBSD": lambda t: t.transpose(0, 1)}
    out, lse = attention.npu_fused_infer_attention_score(to[q_layout](q), to[q_layout](k), to[q_layout](v), num_heads=n,
                                                 scale=0.5, input_layout=layout)
    close(out, to[out_layout](reference), tol=1e-4)
    assert lse.shape == (0,)  # softmax_lse_flag=False: the meta kernel's empty tensor


def test_fia_user_mask_true_means_masked():
    b, s, n, d = 2, 4, 2, 4
    q, k, v = (torch.randn(b, n, s, d) for _ in range(3))
    mask = torch.rand(b, 1, s, s) > 0.6
    mask[..., 0] = False  # every row keeps at least key 0
    out, _ = attention.npu_fused_infer_attention_score(q, k, v, atten_mask=mask, num_heads=n, input_layout="BNSD")
    expected, _ = naive_attention(q, k, v, 1.0, masked=lambda bb, h, i, j: bool(mask[bb, 0, i, j]))
    close(out, expected, tol=1e-4)
    int8_mask = mask.to(torch.int8)
    out8, _ = attention.npu_fused_infer_attention_score(q, k, v, atten_mask=int8_mask, num_heads=n, input_layout="BNSD")
    close(out8, expected, tol=1e-4)


@pytest.mark.parametrize("sparse_mode, rule", [
    (2, lambda i, j, sq, skv: j > i),
    (3, lambda i, j, sq, skv: j > i + (skv - sq)),
    (4, lambda i, j, sq, skv: j > i + (skv - sq) + 1 or j < i + (skv - sq) - 2),  # pre 2, next 1
])
def test_fia_compressed_causal_sparse_modes(sparse_mode, rule):
    sq, skv, n, d = 3, 6, 2, 4
    q, k, v = torch.randn(1, n, sq, d), torch.randn(1, n, skv, d), torch.randn(1, n, skv, d)
    causal = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
    out, lse = attention.npu_fused_infer_attention_score(q, k, v, atten_mask=causal, sparse_mode=sparse_mode, num_heads=n,
                                                 input_layout="BNSD", pre_tokens=2, next_tokens=1,
                                                 softmax_lse_flag=True)
    expected, exp_lse = naive_attention(q, k, v, 1.0, masked=lambda b, h, i, j: rule(i, j, sq, skv))
    close(out, expected, tol=1e-4)
    close(lse[..., 0], exp_lse, tol=1e-4)
    with pytest.raises(RuntimeError, match="needs the compressed causal atten_mask"):
        attention.npu_fused_infer_attention_score(q, k, v, sparse_mode=sparse_mode, num_heads=n, input_layout="BNSD")


def test_fia_actual_seq_lengths_zero_padded_rows():
    b, s, n, d = 2, 4, 1, 4
    q, k, v = (torch.randn(b, s, n * d) for _ in range(3))
    out, lse = attention.npu_fused_infer_attention_score(q, k, v, actual_seq_lengths=[2, 4], actual_seq_lengths_kv=[3, 1],
                                                 num_heads=n, softmax_lse_flag=True)
    expected, exp_lse = naive_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), 1.0, lengths_q=[2, 4],
                                        lengths_kv=[3, 1])
    close(out, expected[:, 0], tol=1e-4)
    close(lse[:, :, :2, 0], exp_lse[:, :, :2], tol=1e-4)
    assert out[0, 2:].abs().sum() == 0


def test_fia_tnd_cumulative_lengths():
    n, d = 2, 4
    q, k, v = torch.randn(5, n, d), torch.randn(7, n, d), torch.randn(7, n, d)
    out, lse = attention.npu_fused_infer_attention_score(q, k, v, actual_seq_lengths=[2, 5], actual_seq_lengths_kv=[3, 7],
                                                 num_heads=n, input_layout="TND", softmax_lse_flag=True)
    assert out.shape == (5, n, d) and lse.shape == (5, n, 1)
    for (q_lo, q_hi), (k_lo, k_hi) in [((0, 2), (0, 3)), ((2, 5), (3, 7))]:
        exp, exp_lse = naive_attention(q[q_lo:q_hi].transpose(0, 1)[None], k[k_lo:k_hi].transpose(0, 1)[None],
                                       v[k_lo:k_hi].transpose(0, 1)[None], 1.0)
        close(out[q_lo:q_hi], exp[0].transpose(0, 1), tol=1e-4)
        close(lse[q_lo:q_hi, :, 0], exp_lse[0].transpose(0, 1), tol=1e-4)
    ntd, _ = attention.npu_fused_infer_attention_score(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                               actual_seq_lengths=[2, 5], actual_seq_lengths_kv=[3, 7], num_heads=n,
                                               input_layout="NTD_TND")
    close(ntd, out)


def test_fia_incremental_decode_mask_b_skv_and_paged_kv():
    b, n, nkv, d, skv, block = 2, 4, 2, 4, 6, 4
    q = torch.randn(b, 1, n * d)
    k, v = torch.randn(b, skv, nkv * d), torch.randn(b, skv, nkv * d)
    mask = torch.zeros(b, skv, dtype=torch.bool)
    mask[1, 0] = True
    out, _ = attention.npu_fused_infer_attention_score(q, k, v, atten_mask=mask, num_heads=n, num_key_value_heads=nkv,
                                               actual_seq_lengths_kv=[5, 6])
    # the same keys in a paged cache: 2 blocks of 4 per sequence, blocks shuffled in the pool
    pool_k, pool_v = torch.zeros(5, block, nkv * d), torch.zeros(5, block, nkv * d)
    table = torch.tensor([[3, 0], [4, 1]], dtype=torch.int32)
    for bb in range(b):
        for slot, blk in enumerate(table[bb].tolist()):
            piece = slice(slot * block, min((slot + 1) * block, skv))
            pool_k[blk, :piece.stop - piece.start] = k[bb, piece]
            pool_v[blk, :piece.stop - piece.start] = v[bb, piece]
    paged, _ = attention.npu_fused_infer_attention_score(q, pool_k, pool_v, atten_mask=mask, block_table=table,
                                                 block_size=block, num_heads=n, num_key_value_heads=nkv,
                                                 actual_seq_lengths_kv=[5, 6])
    split = lambda t, heads: t.reshape(b, -1, heads, d).transpose(1, 2)  # noqa: E731
    expected, _ = naive_attention(split(q, n), split(k, nkv), split(v, nkv), 1.0, lengths_kv=[5, 6],
                                  masked=lambda bb, h, i, j: bool(mask[bb, j]))
    close(out, expected.transpose(1, 2).reshape(b, 1, n * d), tol=1e-4)
    close(paged, out, tol=1e-5)


def test_fia_fully_masked_row_rope_and_dtypes():
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[[[True, True, True], [False, True, False]]]])
    out, lse = attention.npu_fused_infer_attention_score(q, k, v, atten_mask=mask, input_layout="BNSD", softmax_lse_flag=True)
    assert out[0, 0, 0].abs().sum() == 0 and math.isinf(float(lse[0, 0, 0, 0]))
    q_rope, k_rope = torch.randn(1, 1, 2, 2), torch.randn(1, 1, 3, 2)
    with_rope, _ = attention.npu_fused_infer_attention_score(q, k, v, query_rope=q_rope, key_rope=k_rope,
                                                     input_layout="BNSD", scale=0.5)
    expected, _ = naive_attention(torch.cat([q, q_rope], -1), torch.cat([k, k_rope], -1), v, 0.5)
    close(with_rope, expected, tol=1e-4)
    half, _ = attention.npu_fused_infer_attention_score(q.half(), k.half(), v.half(), input_layout="BNSD")
    assert half.dtype == torch.float16
    quant, _ = attention.npu_fused_infer_attention_score(q, k, v, input_layout="BNSD", quant_scale2=torch.tensor([20.0]))
    plain, _ = attention.npu_fused_infer_attention_score(q, k, v, input_layout="BNSD")
    assert quant.dtype == torch.int8
    assert (quant.float() - plain * 20).abs().max() <= 0.5 + 1e-4


def test_fia_meta_error_texts():
    q = torch.randn(1, 2, 8)
    with raises("Layout XYZ is not supported!"):
        attention.npu_fused_infer_attention_score(q, q, q, input_layout="XYZ")
    with raises("Layout BSND, queryDims(3) must be 4!"):
        attention.npu_fused_infer_attention_score(q, q, q, input_layout="BSND")
    with raises("numHeads should be greater than 0, but got 0"):
        attention.npu_fused_infer_attention_score(q, q, q, num_heads=0)
    with pytest.raises(NotImplementedError, match="antiquant_scale"):
        attention.npu_fused_infer_attention_score(q, q, q, antiquant_scale=torch.ones(2))


# ============================================================================ prefetch / format cast
def test_prefetch_is_a_checked_no_op():
    w = torch.randn(4)
    assert layout.npu_prefetch(w, None, 100) is None
    with raises("The max_size should be greater than zero, but got 0."):
        layout.npu_prefetch(w, None, 0)
    with raises("The offset should be nonnegative, but got -1."):
        layout.npu_prefetch(w, None, 10, -1)


def test_format_cast_keeps_values():
    x = torch.randn(2, 3, 4, 5)
    y = layout.npu_format_cast(x, 29)
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr() and y.dtype == x.dtype
    assert torch.equal(layout.npu_format_cast_tensor(x, y), x)
    assert layout.npu_format_cast_inplace(x, y) is x and layout.npu_format_cast_inplace_acl_format(x, 2) is x
