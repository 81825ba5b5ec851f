"""npu_lightning_indexer / npu_quant_lightning_indexer against a per-token, per-key loop of DeepSeek-V3.2's index
score and a Python sort."""
from __future__ import annotations

import pytest
import torch

from pytest_npugraph.runtime.ops import indexer as L


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(5)


def loop_topk(q, keys, w, k, causal_end=None, q_scale=None, k_scale=None):
    """q [N1, D], keys [S2, D] (one key head), w [N1]: sorted (score, position) of the visible keys, best first."""
    scored = []
    for s in range(keys.size(0)):
        if causal_end is not None and s > causal_end:
            continue
        total = 0.0
        for h in range(q.size(0)):
            dot = sum(float(q[h, d]) * float(keys[s, d]) for d in range(q.size(1)))
            if q_scale is not None:
                dot *= float(q_scale[h]) * float(k_scale[s])
            total += float(w[h]) * max(dot, 0.0)
        scored.append((total, s))
    scored.sort(key=lambda p: (-p[0], p[1]))
    return scored[:k]


def test_bsnd_causal_topk_with_padding():
    q = torch.randn(1, 3, 2, 4, dtype=torch.float16)          # B=1, S1=3, N1=2, D=4
    key = torch.randn(1, 5, 1, 4, dtype=torch.float16)        # S2=5, N2=1
    w = torch.randn(1, 3, 2, dtype=torch.float16)
    idx, values = L.npu_lightning_indexer(q, key, w, sparse_count=4, return_value=True)
    assert idx.shape == (1, 3, 1, 4) and idx.dtype == torch.int32 and values.shape == (1, 3, 1, 4)
    for i in range(3):
        want = loop_topk(q[0, i], key[0, :, 0], w[0, i], 4, causal_end=5 - 3 + i)
        got = idx[0, i, 0].tolist()
        assert got[:len(want)] == [p for _, p in want]
        assert got[len(want):] == [-1] * (4 - len(want))
        for j, (score, _) in enumerate(want):
            assert float(values[0, i, 0, j]) == pytest.approx(score, rel=2e-2, abs=2e-2)


def test_tnd_query_paged_keys_as_vllm_ascend_calls_it():
    # two requests: 1 new token over 3 cached keys, 3 new tokens over 4 cached keys; block_size 2
    q = torch.randn(4, 4, 8)
    w = torch.randn(4, 4)
    cache = torch.randn(5, 2, 1, 8)
    table = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    idx, empty = L.npu_lightning_indexer(q, cache, w, actual_seq_lengths_query=torch.tensor([1, 4], dtype=torch.int32),
                                         actual_seq_lengths_key=torch.tensor([3, 4], dtype=torch.int32),
                                         block_table=table, layout_query="TND", layout_key="PA_BSND", sparse_count=3)
    assert idx.shape == (4, 1, 3) and empty.numel() == 0
    seqs = [(0, 1, 3), (1, 3, 4)]                               # (first query row, S1, S2)
    for b, (row, s1, s2) in enumerate(seqs):
        keys = torch.stack([cache[table[b, p // 2], p % 2, 0] for p in range(s2)])
        for i in range(s1):
            want = loop_topk(q[row + i], keys, w[row + i], 3, causal_end=s2 - s1 + i)
            got = idx[row + i, 0].tolist()
            assert got == [p for _, p in want] + [-1] * (3 - len(want))


def test_sparse_mode_0_sees_every_key_and_errors():
    q, key, w = torch.randn(1, 2, 2, 4), torch.randn(1, 3, 1, 4), torch.randn(1, 2, 2)
    idx, _ = L.npu_lightning_indexer(q, key, w, sparse_count=3, sparse_mode=0)
    assert idx[0, 0, 0].tolist() == [p for _, p in loop_topk(q[0, 0], key[0, :, 0], w[0, 0], 3)]
    with pytest.raises(RuntimeError, match="sparse_count should be greater than 0, but got 0"):
        L.npu_lightning_indexer(q, key, w, sparse_count=0)
    with pytest.raises(RuntimeError, match="Input query should not be empty."):
        L.npu_lightning_indexer(q[:, :0], key, w, sparse_count=2)
    with pytest.raises(RuntimeError, match="actual_seq_lengths_query is required"):
        L.npu_lightning_indexer(q[0], key, w[0], layout_query="TND", sparse_count=2)


def test_meta_shapes_are_the_wheels():
    q, key, w = (torch.empty(s, device="meta") for s in ((6, 4, 8), (9, 16, 1, 8), (6, 4)))
    idx, values = L._lightning_indexer_meta(q, key, w, layout_query="TND", layout_key="PA_BSND", sparse_count=7)
    assert idx.shape == (6, 1, 7) and idx.dtype == torch.int32 and values.shape == (0,)
    q4 = torch.empty(2, 3, 4, 8, device="meta")
    idx, values = L._lightning_indexer_meta(q4, torch.empty(2, 5, 1, 8, device="meta"), w, sparse_count=7,
                                            return_value=True)
    assert idx.shape == (2, 3, 1, 7) and values.shape == (2, 3, 1, 7)


def test_quant_indexer_dequantises_per_token_head():
    q = torch.randint(-9, 9, (1, 2, 2, 4), dtype=torch.int8)
    key = torch.randint(-9, 9, (1, 4, 1, 4), dtype=torch.int8)
    w = torch.randn(1, 2, 2, dtype=torch.float16)
    qs, ks = torch.rand(1, 2, 2, dtype=torch.float16) + 0.1, torch.rand(1, 4, 1, dtype=torch.float16) + 0.1
    idx = L.npu_quant_lightning_indexer(q, key, w, qs, ks, 0, 0, sparse_count=4)
    for i in range(2):
        want = loop_topk(q[0, i], key[0, :, 0], w[0, i], 4, causal_end=4 - 2 + i, q_scale=qs[0, i], k_scale=ks[0, :, 0])
        assert idx[0, i, 0].tolist() == [p for _, p in want] + [-1] * (4 - len(want))
    with pytest.raises(RuntimeError, match="only support 0"):
        L.npu_quant_lightning_indexer(q, key, w, qs, ks, 1, 0, sparse_count=4)


def test_on_npu_a_mixed_kernel(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    q, key, w = torch.randn(1, 2, 2, 4), torch.randn(1, 3, 1, 4), torch.randn(1, 2, 2)
    idx, _ = torch_npu.npu_lightning_indexer(q.npu(), key.npu(), w.npu(), sparse_count=2)
    assert torch.equal(idx.cpu(), L.npu_lightning_indexer(q, key, w, sparse_count=2)[0])
    kernel = [r for r in npugraph.trace.records if type(r) is Kernel and "lightning_indexer" in r.op][0]
    assert kernel.cores.kind == "AICore" and kernel.cores.cube and kernel.cores.vector
    npugraph.assert_clean()
