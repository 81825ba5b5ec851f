"""npu_rms_norm_dynamic_mx_quant / npu_add_rms_norm_dynamic_mx_quant: RMSNorm computed per row by hand, then the
MX quantisation checked block by block (a power-of-two scale per 32 values, values rebuilt from y * 2**(e-127))."""
from __future__ import annotations

import math

import pytest
import torch

from pytest_npugraph.runtime.ops import mxquant as M


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(17)


def rms_rows(x, gamma, eps):
    out = []
    for row in x.float():
        inv = 1.0 / math.sqrt(sum(float(v) ** 2 for v in row) / row.numel() + eps)
        out.append([float(v) * inv * float(g) for v, g in zip(row, gamma.float())])
    return torch.tensor(out, dtype=torch.float64), None


def test_rms_norm_fp8_mx_quant_rebuilds_the_normalised_rows():
    x, gamma = torch.randn(3, 64, dtype=torch.bfloat16), torch.rand(64, dtype=torch.bfloat16) + 0.5
    y, scale, rstd = M.npu_rms_norm_dynamic_mx_quant(x, gamma, dst_type=24)
    assert y.dtype == torch.float8_e4m3fn and scale.shape == (3, 1, 2) and rstd.shape == (3, 1)
    normed, _ = rms_rows(x, gamma, 1e-6)
    for r in range(3):
        assert float(rstd[r, 0]) == pytest.approx(1.0 / math.sqrt(float((x[r].float() ** 2).mean()) + 1e-6), rel=1e-5)
        for blk in range(2):
            e = int(scale[r, 0, blk]) - 127
            amax = max(abs(v) for v in normed[r, blk * 32:(blk + 1) * 32].tolist())
            assert e == math.floor(math.log2(amax)) - 8                 # OCP: floor(log2 amax) - emax(e4m3)
            for j in range(blk * 32, (blk + 1) * 32):
                assert float(y[r, j]) * 2.0 ** e == pytest.approx(float(normed[r, j]), rel=0.07, abs=2.0 ** e / 8)


def test_add_rms_norm_returns_the_sum_and_fp4_packed_values():
    x1, x2 = torch.randn(2, 64, dtype=torch.float16), torch.randn(2, 64, dtype=torch.float16)
    gamma = torch.ones(64, dtype=torch.float16)
    y, x_out, scale, rstd = M.npu_add_rms_norm_dynamic_mx_quant(x1, x2, gamma)
    assert torch.equal(x_out, x1 + x2)
    assert y.dtype == torch.uint8 and y.shape == (2, 32) and scale.shape == (2, 1, 2)
    single = M.npu_rms_norm_dynamic_mx_quant(x1 + x2, gamma)
    assert torch.equal(single[0], y) and torch.equal(single[1], scale)


def test_errors_and_meta_are_the_wheels():
    x, gamma = torch.randn(2, 63, dtype=torch.bfloat16), torch.ones(63, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Invalid scale_alg value: 2. Expected 0 or 1."):
        M.npu_rms_norm_dynamic_mx_quant(x, gamma, scale_alg=2)
    with pytest.raises(RuntimeError, match="the last dim of input must be divisible by 2"):
        M.npu_rms_norm_dynamic_mx_quant(x, gamma)
    y, scale, rstd = M._rms_mx_meta(torch.empty(4, 5, 128, device="meta"), torch.empty(128, device="meta"), 0, 296)
    assert y.shape == (4, 5, 64) and scale.shape == (4, 5, 2, 2) and rstd.shape == (4, 5, 1)


def test_on_npu_through_torch_ops(npugraph):
    x, gamma = torch.randn(2, 64, dtype=torch.bfloat16), torch.rand(64, dtype=torch.bfloat16)
    y, scale, _ = torch.ops.npu.npu_rms_norm_dynamic_mx_quant(x.npu(), gamma.npu(), dst_type=24)
    want = M.npu_rms_norm_dynamic_mx_quant(x, gamma, dst_type=24)
    assert torch.equal(y.cpu().view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(scale.cpu(), want[1])
    npugraph.assert_clean()
