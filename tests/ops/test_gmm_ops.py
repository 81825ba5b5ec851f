"""npu_grouped_matmul_finalize_routing against a per-row loop (int8 accumulate, scales, logit-weighted
scatter-add into the tokens, shared-expert rows)."""
from __future__ import annotations

import pytest
import torch

from pytest_npugraph.runtime.ops import gmm as M


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(3)


def test_grouped_matmul_finalize_routing_int8_combine_with_shared_expert():
    m, k, n, experts, batch, top_k = 6, 4, 3, 3, 3, 2
    x = torch.randint(-10, 10, (m, k), dtype=torch.int8)
    w = torch.randint(-10, 10, (experts, k, n), dtype=torch.int8)
    scale, pertoken = torch.rand(experts, n), torch.rand(m)
    group_list = torch.tensor([2, 1, 3])                       # counts: rows 0-1 e0, row 2 e1, rows 3-5 e2
    logit = torch.rand(m)
    row_index = torch.tensor([0, 2, 1, 0, 2, 1])               # each row's token
    shared = torch.randn(2, n, dtype=torch.bfloat16)
    out = M.npu_grouped_matmul_finalize_routing(x, w, group_list, scale=scale, pertoken_scale=pertoken,
                                                shared_input=shared, logit=logit, row_index=row_index,
                                                shared_input_weight=0.5, shared_input_offset=1, output_bs=batch)
    assert (out.shape, out.dtype) == ((batch, n), torch.float32)
    expected = [[0.0] * n for _ in range(batch)]
    group_of = [0, 0, 1, 2, 2, 2]
    for r in range(m):
        g = group_of[r]
        for j in range(n):
            acc = sum(int(x[r, q]) * int(w[g, q, j]) for q in range(k))
            expected[row_index[r]][j] += acc * scale[g, j].item() * pertoken[r].item() * logit[r].item()
    for s in range(2):
        for j in range(n):
            expected[1 + s][j] += shared[s, j].item() * 0.5
    torch.testing.assert_close(out, torch.tensor(expected), rtol=1e-5, atol=1e-4)
    assert top_k == 2 and batch * top_k == m


def test_grouped_matmul_finalize_routing_cumsum_groups_ignore_tail_rows():
    x, w = torch.randn(5, 4), torch.randn(2, 4, 3)
    out = M.npu_grouped_matmul_finalize_routing(x, w, torch.tensor([1, 3]), group_list_type=0)
    expected = torch.zeros(5, 3)
    expected[0] = x[0] @ w[0]
    expected[1:3] = x[1:3] @ w[1]
    torch.testing.assert_close(out, expected)


def test_grouped_matmul_finalize_routing_meta_errors():
    x, w, g = torch.empty(4, 8, device="meta"), torch.empty(2, 8, 16, device="meta"), torch.empty(2, device="meta")
    assert M._gmmfr_meta(x, w, g, output_bs=3).shape == (3, 16)
    with pytest.raises(RuntimeError, match="x_dim should be 2 and w_dim should be 3."):
        M._gmmfr_meta(x, w[0], g)
    with pytest.raises(RuntimeError, match="When shared_input is not None, output_dtype must be float32, but it is "
                                           "torch.bfloat16"):
        M._gmmfr_meta(x, w, g, shared_input=x, logit=g, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Not supportted output dtype is torch.float16"):
        M.npu_grouped_matmul_finalize_routing(torch.randn(2, 4), torch.randn(1, 4, 2), torch.tensor([2]),
                                              dtype=torch.float16)
