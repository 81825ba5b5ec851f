"""npu_grouped_matmul_swiglu_quant(_v2) and npu_quant_grouped_matmul_dequant against per-row loops: each row's
expert found by scanning group_list, its dot products summed in Python, SwiGLU and requantisation per element."""
from __future__ import annotations

import math

import pytest
import torch

from pytest_npugraph.runtime.ops import gmm_swiglu as G


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(9)


def expert_of(row, ends):
    for e, end in enumerate(ends):
        if row < end:
            return e
    return None


def swiglu_row(x, w, xs, ws):
    """One row's dequantised product [N] -> silu(first half) * second half, as floats."""
    n = w.size(1)
    h = [sum(int(x[k]) * int(w[k, j]) for k in range(x.numel())) * float(xs) * float(ws[j]) for j in range(n)]
    a, b = h[:n // 2], h[n // 2:]
    return [ai / (1.0 + math.exp(-ai)) * bi for ai, bi in zip(a, b)]


def test_v1_rows_quantised_per_token_and_rows_past_the_groups_zero():
    x = torch.randint(-9, 9, (6, 8), dtype=torch.int8)
    w = torch.randint(-9, 9, (2, 8, 6), dtype=torch.int8)
    ws, xs = torch.rand(2, 6) + 0.1, torch.rand(6) + 0.1
    ends = [2, 5]                                               # row 5 belongs to no expert
    out, scale, offset = G.npu_grouped_matmul_swiglu_quant(x, w, torch.tensor(ends), ws, xs)
    assert out.shape == (6, 3) and out.dtype == torch.int8 and scale.shape == (6,) and offset.shape == ()
    for r in range(6):
        e = expert_of(r, ends)
        if e is None:
            assert out[r].abs().sum() == 0 and float(scale[r]) == 0
            continue
        a = swiglu_row(x[r], w[e], xs[r], ws[e])
        s = max(abs(v) for v in a) / 127.0
        assert float(scale[r]) == pytest.approx(s, rel=1e-5)
        assert out[r].tolist() == [max(-128, min(127, round(v / s))) for v in a]


def test_v2_counts_group_list_and_float8_output():
    x = torch.randint(-9, 9, (5, 8), dtype=torch.int8)
    w = torch.randint(-9, 9, (2, 8, 4), dtype=torch.int8)
    ws, xs = torch.rand(2, 4) + 0.1, torch.rand(5) + 0.1
    out, scale = G.npu_grouped_matmul_swiglu_quant_v2(x, [w], [ws], xs, torch.tensor([3, 2]), group_list_type=1)
    v1_out, v1_scale, _ = G.npu_grouped_matmul_swiglu_quant(x, w, torch.tensor([3, 5]), ws, xs)
    assert torch.equal(out, v1_out) and torch.equal(scale, v1_scale)
    q8, s8 = G.npu_grouped_matmul_swiglu_quant_v2(x, [w], [ws], xs, torch.tensor([3, 5]), quant_dtype=24)
    assert q8.dtype == torch.float8_e4m3fn
    for r in range(5):
        a = swiglu_row(x[r], w[expert_of(r, [3, 5])], xs[r], ws[expert_of(r, [3, 5])])
        s = max(abs(v) for v in a) / 448.0
        assert float(s8[r]) == pytest.approx(s, rel=1e-5)
        for j, v in enumerate(a):
            assert float(q8[r, j]) * s == pytest.approx(v, rel=0.07, abs=1e-3 * s)


def test_v2_errors_are_the_wheels_and_unemulated_modes_say_so():
    x, w, ws, xs = torch.zeros(2, 8, dtype=torch.int8), torch.zeros(1, 8, 4, dtype=torch.int8), torch.ones(1, 4), \
        torch.ones(2)
    with pytest.raises(RuntimeError, match="The size of weight should be 1, current size is 2."):
        G.npu_grouped_matmul_swiglu_quant_v2(x, [w, w], [ws], xs, torch.tensor([2]))
    with pytest.raises(RuntimeError, match="dequant_dtype only supports torch.int8, torch.float32"):
        G.npu_grouped_matmul_swiglu_quant_v2(x, [w], [ws], xs, torch.tensor([2]), dequant_dtype=3)
    with pytest.raises(NotImplementedError, match="dequant_mode 2"):
        G.npu_grouped_matmul_swiglu_quant_v2(x, [w], [ws], xs, torch.tensor([2]), dequant_mode=2)
    out, scale = G._v2_meta(x.to("meta"), [w.to("meta")], [ws.to("meta")], xs.to("meta"), None)
    assert out.shape == (2, 2) and out.dtype == torch.int8 and scale.shape == (2,)


def test_quant_grouped_matmul_dequant_pertoken():
    x = torch.randn(4, 8, dtype=torch.float16)
    w = torch.randint(-9, 9, (2, 3, 8), dtype=torch.int8)        # [E, N, K]
    ws = torch.rand(2, 3) + 0.1
    y = G.npu_quant_grouped_matmul_dequant(x, w, ws, torch.tensor([1, 4]), quant_mode="pertoken")
    assert y.shape == (4, 3) and y.dtype == torch.float16
    for r in range(4):
        e = expert_of(r, [1, 4])
        s = max(abs(float(v)) for v in x[r]) / 127.0
        q = [max(-128, min(127, round(float(v) / s))) for v in x[r]]
        for n in range(3):
            want = sum(q[k] * int(w[e, n, k]) for k in range(8)) * s * float(ws[e, n])
            assert float(y[r, n]) == pytest.approx(want, rel=2e-3, abs=2e-3)
    with pytest.raises(RuntimeError, match="the x dtype support only float16"):
        G.npu_quant_grouped_matmul_dequant(x.float(), w, ws, torch.tensor([1, 4]))
    with pytest.raises(RuntimeError, match=r"x shape\[1\] not equal to quantized_weight shape\[1\]"):
        G.npu_quant_grouped_matmul_dequant(x[:, :4], w, ws, torch.tensor([1, 4]))


def test_on_npu_moe_gate_up_in_one_kernel(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    x = torch.randint(-9, 9, (4, 8), dtype=torch.int8)
    w = torch.randint(-9, 9, (2, 8, 4), dtype=torch.int8)
    ws, xs = torch.rand(2, 4), torch.rand(4)
    out, scale = torch_npu.npu_grouped_matmul_swiglu_quant_v2(x.npu(), [w.npu()], [ws.npu()], xs.npu(),
                                                              torch.tensor([2, 4]).npu())
    want, want_scale, _ = G.npu_grouped_matmul_swiglu_quant(x, w, torch.tensor([2, 4]), ws, xs)
    assert torch.equal(out.cpu(), want) and torch.equal(scale.cpu(), want_scale)
    kernel = [r for r in npugraph.trace.records if type(r) is Kernel and "swiglu_quant_v2" in r.op][0]
    assert kernel.cores.cube and kernel.cores.vector
    npugraph.assert_clean()
