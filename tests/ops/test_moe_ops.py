"""MoE routing ops (expert token counts, token permute/unpermute) against the torch_npu docstring
examples and plain-loop computations."""
from __future__ import annotations

import re

import pytest
import torch

from pytest_npugraph.runtime.ops import moe as M


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(3)


def test_compute_expert_tokens_doc_example_and_loop():
    out = M.npu_moe_compute_expert_tokens(torch.tensor([0, 0, 0, 1, 1, 2], dtype=torch.int32), 3)
    assert out.tolist() == [3, 5, 6] and out.dtype == torch.int32
    experts = sorted(torch.randint(0, 6, (20,)).tolist())
    out = M.npu_moe_compute_expert_tokens(torch.tensor(experts, dtype=torch.int32), 8)
    assert out.tolist() == [sum(1 for e in experts if e <= i) for i in range(8)]
    assert M._compute_expert_tokens_meta(torch.empty(6, dtype=torch.int32, device="meta"), 5).shape == (5,)


def test_token_permute_doc_example():
    tokens = torch.tensor([[1, 1], [2, 2], [3, 3], [4, 4]], dtype=torch.float16)
    indices = torch.tensor([[0, 1], [1, 0], [0, 2], [2, 0]])
    permuted, sorted_indices = M.npu_moe_token_permute(tokens, indices)
    assert permuted[:, 0].tolist() == [1, 2, 3, 4, 1, 2, 3, 4]
    assert sorted_indices.tolist() == [0, 4, 5, 1, 2, 6, 7, 3] and sorted_indices.dtype == torch.int32


def test_token_unpermute_doc_example():
    permuted = torch.tensor([[1, 1], [2, 2], [3, 3], [4, 4], [1, 1], [2, 2], [3, 3], [4, 4]], dtype=torch.float16)
    sorted_indices = torch.tensor([0, 4, 5, 1, 2, 6, 7, 3], dtype=torch.int32)
    out = M.npu_moe_token_unpermute(permuted, sorted_indices, probs=torch.ones(4, 2, dtype=torch.float16) / 2)
    assert out.tolist() == [[1, 1], [2, 2], [3, 3], [4, 4]]


def test_permute_then_unpermute_is_the_weighted_moe_sum():
    n, k, h = 5, 3, 4
    tokens = torch.randn(n, h)
    indices = torch.stack([torch.randperm(6)[:k] for _ in range(n)])
    probs = torch.rand(n, k)
    permuted, sorted_indices = M.npu_moe_token_permute(tokens, indices)
    # the permuted rows are grouped by expert: copy i of token i // k sits at sorted_indices[i]
    experts_in_order = [indices.reshape(-1)[i].item() for i in sorted(range(n * k), key=lambda i: sorted_indices[i])]
    assert experts_in_order == sorted(experts_in_order)
    for i in range(n * k):
        assert torch.equal(permuted[sorted_indices[i]], tokens[i // k])
    out = M.npu_moe_token_unpermute(permuted * 2, sorted_indices, probs)
    expected = torch.stack([sum(probs[t, j] * tokens[t] * 2 for j in range(k)) for t in range(n)])
    torch.testing.assert_close(out, expected)


def test_permute_num_out_tokens_drops_the_tail_and_unpermute_skips_it():
    tokens = torch.arange(8.0).reshape(4, 2)
    indices = torch.tensor([3, 0, 2, 1])                  # 1-D: top-1
    permuted, sorted_indices = M.npu_moe_token_permute(tokens, indices, num_out_tokens=3)
    assert permuted.tolist() == [[2, 3], [6, 7], [4, 5]]
    assert sorted_indices.tolist() == [3, 0, 2, 1]
    out = M.npu_moe_token_unpermute(permuted, sorted_indices)
    assert out.tolist() == [[0, 0], [2, 3], [4, 5], [6, 7]]   # token 0 (expert 3) was dropped
    assert M.npu_moe_token_permute(tokens, indices, num_out_tokens=-1)[0].shape == (3, 2)
    meta = M._token_permute_meta(tokens.to("meta"), indices.to("meta"), num_out_tokens=10)
    assert [tuple(t.shape) for t in meta] == [(4, 2), (4,)]


def test_permute_unpermute_dimension_errors():
    with pytest.raises(RuntimeError, match=re.escape("The dims of input tokens should be 2 dimensional, but got "
                                                     "3-dimensional.")):
        M.npu_moe_token_permute(torch.zeros(1, 2, 3), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(RuntimeError, match=re.escape("The dims of input indices should be 2 or 1 dimensional, but "
                                                     "got 3-dimensional.")):
        M.npu_moe_token_permute(torch.zeros(2, 3), torch.zeros(1, 1, 2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match=re.escape("The dims of input sorted_indices should be 1 dimensional")):
        M.npu_moe_token_unpermute(torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=re.escape("The dims of input probs should be 2 dimensional, but got "
                                                     "1-dimensional.")):
        M._token_unpermute_meta(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int32), torch.ones(2))
