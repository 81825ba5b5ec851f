"""npu_transpose_batchmatmul, npu_transpose_quant_batchmatmul and _npu_matmul_add_fp32 against loop-written
matmuls (one dot product per output element)."""
from __future__ import annotations

import pytest
import torch

from pytest_npugraph.runtime.ops import batchmatmul as B


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(3)


def loop_bmm(a, b):
    """out[i, j, l] = sum_k a[i, j, k] * b[i, k, l] (a [B, M, K], b [B, K, N]) in float64."""
    batch, m, k = a.shape
    n = b.size(2)
    out = torch.zeros(batch, m, n, dtype=torch.float64)
    for i in range(batch):
        for j in range(m):
            for l in range(n):
                out[i, j, l] = sum(float(a[i, j, t]) * float(b[i, t, l]) for t in range(k))
    return out


def test_mla_up_projection_form_token_major_in_and_out():
    # vLLM-Ascend SFA: x [N heads, T tokens, L] @ W_UV [N, L, V] -> [T, N, V]
    x, w = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    y = B.npu_transpose_batchmatmul(x, w, perm_y=[1, 0, 2])
    want = loop_bmm(x, w)                                   # [N, T, V]
    assert y.shape == (4, 3, 2) and y.dtype == torch.float32
    for t in range(4):
        for n in range(3):
            torch.testing.assert_close(y[t, n].double(), want[n, t], atol=1e-5, rtol=1e-5)


def test_perm_x1_reads_token_major_input_and_perm_x2_transposed_weight():
    x = torch.randn(4, 3, 6, dtype=torch.float16)            # [M, B, K]
    w = torch.randn(3, 2, 6, dtype=torch.float16)            # [B, N, K]: perm_x2 [0, 2, 1]
    y = B.npu_transpose_batchmatmul(x, w, perm_x1=[1, 0, 2], perm_x2=[0, 2, 1], perm_y=[1, 0, 2])
    assert y.shape == (4, 3, 2) and y.dtype == torch.float16
    for m in range(4):
        for b in range(3):
            for n in range(2):
                want = sum(float(x[m, b, k]) * float(w[b, n, k]) for k in range(6))
                assert float(y[m, b, n]) == pytest.approx(want, abs=2e-2, rel=2e-3)


def test_scale_requantises_to_int8_and_batch_split_factor_slices():
    x, w = torch.randn(2, 3, 4), torch.randn(2, 4, 3)        # B=2, M=3, N=3
    scale = torch.full((6,), 4.0)
    q = B.npu_transpose_batchmatmul(x, w, scale=scale)
    y = loop_bmm(x, w).permute(1, 0, 2).reshape(3, 1, 6)
    assert q.dtype == torch.int8 and q.shape == (3, 1, 6)
    assert torch.equal(q, torch.round(y * 4).clamp(-128, 127).to(torch.int8))
    s = B.npu_transpose_batchmatmul(x, w, batch_split_factor=2)
    flat = loop_bmm(x, w).permute(1, 0, 2).reshape(3, 6)
    assert s.shape == (2, 3, 3)
    torch.testing.assert_close(s[0].double(), flat[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s[1].double(), flat[:, 3:], atol=1e-5, rtol=1e-5)


def test_argument_errors_are_the_wheels():
    x, w = torch.randn(2, 3, 4), torch.randn(2, 4, 3)
    with pytest.raises(RuntimeError, match=r"perm_x1 should be \[0, 1, 2\] or \[1, 0, 2\]"):
        B.npu_transpose_batchmatmul(x, w, perm_x1=[2, 1, 0])
    with pytest.raises(RuntimeError, match=r"perm_y should be \[1, 0, 2\]"):
        B.npu_transpose_batchmatmul(x, w, perm_y=[0, 1, 2])
    with pytest.raises(RuntimeError, match="The bias is not supported in TransposeBatchMatMul"):
        B.npu_transpose_batchmatmul(x, w, bias=torch.zeros(3))
    with pytest.raises(RuntimeError, match="input's type supported for float16, float32 and bfloat16"):
        B.npu_transpose_batchmatmul(x.to(torch.int8), w)


def test_meta_shapes_follow_the_wheel():
    x, w = torch.empty(4, 3, 6, device="meta"), torch.empty(3, 6, 2, device="meta")
    assert B._transpose_batchmatmul_meta(x, w, perm_x1=[1, 0, 2]).shape == (4, 3, 2)
    assert B._transpose_batchmatmul_meta(x, w, perm_x1=[1, 0, 2], scale=torch.empty(6, device="meta")).shape == (4, 1, 6)
    assert B._transpose_batchmatmul_meta(x, w, perm_x1=[1, 0, 2], batch_split_factor=3).shape == (3, 4, 2)


def test_quant_form_per_token_per_channel_and_mx():
    x1 = torch.randint(-8, 8, (3, 2, 64), dtype=torch.int8)            # [M, B, K]
    x2 = torch.randint(-8, 8, (2, 64, 4), dtype=torch.int8)            # [B, K, N]
    s1, s2 = torch.rand(3), torch.rand(4)
    y = B.npu_transpose_quant_batchmatmul(x1, x2, 6, x1_scale=s1, x2_scale=s2, perm_x1=[1, 0, 2], perm_y=[1, 0, 2])
    want = loop_bmm(x1.permute(1, 0, 2), x2).permute(1, 0, 2) * s1.double()[:, None, None] * s2.double()
    torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=1e-5)
    # MX: exponent bytes, one per 32 values of K, in pairs ([M, B, K/64, 2] and [B, K/64, N, 2])
    e1 = torch.randint(125, 130, (3, 2, 1, 2), dtype=torch.uint8)
    e2 = torch.randint(125, 130, (2, 1, 4, 2), dtype=torch.uint8)
    f1, f2 = x1.to(torch.float8_e4m3fn), x2.to(torch.float8_e4m3fn)
    y = B.npu_transpose_quant_batchmatmul(f1, f2, 15, x1_scale=e1, x2_scale=e2, group_sizes=[0, 0, 32],
                                          perm_x1=[1, 0, 2], perm_y=[1, 0, 2])
    assert y.dtype == torch.bfloat16 and y.shape == (3, 2, 4)
    for m in range(3):
        for b in range(2):
            for n in range(4):
                want = sum(float(x1[m, b, k]) * 2.0 ** (int(e1[m, b, 0, k // 32]) - 127) *
                           float(x2[b, k, n]) * 2.0 ** (int(e2[b, 0, n, k // 32]) - 127) for k in range(64))
                assert float(y[m, b, n]) == pytest.approx(want, rel=1e-2, abs=1e-2)


def test_matmul_add_fp32_accumulates_the_transposed_product():
    x, w = torch.randn(3, 4, dtype=torch.float16), torch.randn(3, 2, dtype=torch.float16)
    c = torch.randn(4, 2)
    before = c.clone()
    B._npu_matmul_add_fp32(x, w, c)
    for i in range(4):
        for j in range(2):
            want = float(before[i, j]) + sum(float(x[t, i]) * float(w[t, j]) for t in range(3))
            assert float(c[i, j]) == pytest.approx(want, abs=1e-4)
    with pytest.raises(RuntimeError, match="C must be float32"):
        B._npu_matmul_add_fp32(x, w, c.half())


def test_on_npu_through_torch_npu(npugraph):
    import torch_npu

    x, w = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    y = torch_npu.npu_transpose_batchmatmul(x.npu(), w.npu(), perm_y=(1, 0, 2))
    torch.testing.assert_close(y.cpu().double(), loop_bmm(x, w).permute(1, 0, 2), atol=1e-5, rtol=1e-5)
    c = torch.zeros(4, 4).npu()
    torch_npu._npu_matmul_add_fp32(torch.ones(2, 4, dtype=torch.float16).npu(),
                                   torch.ones(2, 4, dtype=torch.float16).npu(), c)
    assert torch.equal(c.cpu(), torch.full((4, 4), 2.0))
    npugraph.assert_clean()
    from pytest_npugraph.trace import Kernel

    kinds = {k.op: k.cores.kind for k in npugraph.trace.records
             if type(k) is Kernel and ("transpose_batchmatmul" in k.op or "matmul_add_fp32" in k.op)}
    assert sorted(kinds.values()) == ["AICore", "ATB"], kinds
    assert [k for k in kinds if "transpose" in k] and kinds[[k for k in kinds if "transpose" in k][0]] == "AICore"
