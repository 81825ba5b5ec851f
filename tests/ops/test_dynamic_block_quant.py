"""npu_dynamic_block_quant against a block-by-block loop (the max of each block by hand, then each element)."""
from __future__ import annotations

import pytest
import torch

from pytest_npugraph.runtime.ops import block_quant as Q


def loop_block_quant(x, rb, cb, qmax=127.0, min_scale=0.0):
    rows, cols = x.shape
    scales, y = {}, torch.zeros(rows, cols, dtype=torch.int64)
    for i in range(0, rows, rb):
        for j in range(0, cols, cb):
            amax = max(abs(float(x[r, c])) for r in range(i, min(i + rb, rows)) for c in range(j, min(j + cb, cols)))
            s = max(amax / qmax, min_scale)
            scales[(i // rb, j // cb)] = s
            for r in range(i, min(i + rb, rows)):
                for c in range(j, min(j + cb, cols)):
                    y[r, c] = max(-128, min(127, round(float(x[r, c]) / s))) if s else 0
    return y, scales


@pytest.mark.parametrize("rb, cb", [(1, 128), (2, 3)])
def test_blocks_quantise_independently(rb, cb):
    torch.manual_seed(2)
    x = torch.randn(5, 7, dtype=torch.float16) * torch.arange(1, 8, dtype=torch.float16)
    y, scale = Q.npu_dynamic_block_quant(x, row_block_size=rb, col_block_size=cb)
    want_y, want_scale = loop_block_quant(x.float(), rb, cb)
    assert y.dtype == torch.int8 and (y.long() - want_y).abs().max() <= 1        # ties of float32 rounding
    assert scale.shape == (-(-5 // rb), -(-7 // cb))
    for (i, j), s in want_scale.items():
        assert float(scale[i, j]) == pytest.approx(s, rel=1e-6)


def test_min_scale_3d_and_errors():
    x = torch.full((2, 1, 4), 1e-3, dtype=torch.bfloat16)
    y, scale = Q.npu_dynamic_block_quant(x, min_scale=0.1)
    assert scale.shape == (2, 1, 1) and torch.allclose(scale, torch.full((2, 1, 1), 0.1))
    assert y.abs().max() == 0
    with pytest.raises(RuntimeError, match="Expected x to have 2 or 3 dimensions, but got 1."):
        Q.npu_dynamic_block_quant(x.reshape(-1))


def test_docstring_example_shape_on_npu(npugraph):
    import torch_npu

    x = torch.rand(3, 4).to(torch.float16)
    y, scale = torch_npu.npu_dynamic_block_quant(x.npu(), min_scale=0, dst_type=1, row_block_size=1,
                                                 col_block_size=128)
    assert y.shape == (3, 4) and scale.shape == (3, 1)
    assert (y.cpu().abs().amax(dim=1) == 127).all()                   # each row's largest value maps to 127
    npugraph.assert_clean()
