"""The ATB ops of vLLM-Ascend's encoder/prefill attention and paged-cache reads: _npu_flash_attention_unpad(_v2),
_npu_flash_attention, npu_paged_cache_load(.out), _npu_paged_attention_get_workspace; against per-token loops."""
from __future__ import annotations

import math

import pytest
import torch

from pytest_npugraph.runtime.ops import paged as P
from pytest_npugraph.runtime.ops import unpad_attention as U


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(13)


def loop_attention(q, k, v, lens, scale, group, mask=None):
    """Token by token: o[t, h] = sum_s p_s v[s, h // group], p = softmax over the sequence's keys s."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    start = 0
    for b, n in enumerate(lens):
        for t in range(start, start + n):
            for h in range(q.size(1)):
                logits = []
                for s in range(start, start + n):
                    dot = sum(float(q[t, h, d]) * float(k[s, h // group, d]) for d in range(q.size(2))) * scale
                    if mask is not None:
                        m = mask if mask.dim() == 2 else mask[b]
                        dot += float(m[t - start, s - start])
                    logits.append(dot)
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for i, s in enumerate(range(start, start + n)):
                    out[t, h] += weights[i] / total * v[s, h // group].double()
        start += n
    return out


def test_unpad_attends_within_each_sequence_with_gqa():
    q = torch.randn(5, 4, 8, dtype=torch.float16)
    k, v = torch.randn(5, 2, 8, dtype=torch.float16), torch.randn(5, 2, 8, dtype=torch.float16)
    out = torch.zeros_like(q)
    U._npu_flash_attention_unpad(q, k, v, torch.tensor([2, 3]), 0.35, 4, 2, out)
    torch.testing.assert_close(out.double(), loop_attention(q, k, v, [2, 3], 0.35, 2), atol=2e-3, rtol=2e-3)
    out2 = torch.zeros_like(q)
    U._npu_flash_attention_unpad_v2(q, k, v, torch.tensor([2, 3]), 0.35, 4, 2, kernel_type=1, out=out2)
    assert torch.equal(out, out2)


def test_masked_flash_attention_is_causal_with_the_triangular_mask():
    q, k, v = (torch.randn(5, 2, 4, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.triu(torch.full((8, 8), float("-inf")), 1).to(torch.bfloat16)
    out = torch.zeros_like(q)
    U._npu_flash_attention(q, k, v, mask, torch.tensor([3, 2]), 0.5, 2, 2, out)
    torch.testing.assert_close(out.double(), loop_attention(q, k, v, [3, 2], 0.5, 1, mask=mask.float()),
                               atol=2e-2, rtol=2e-2)
    assert torch.allclose(out[0].float(), v[0].float(), atol=1e-2)      # the first token sees only itself


def test_unpad_errors():
    q = torch.randn(4, 2, 8)
    with pytest.raises(RuntimeError, match="must all be float16 or bfloat16"):
        U._npu_flash_attention_unpad(q, q, q, torch.tensor([4]), 1.0, 2, 2, torch.zeros_like(q))
    h = q.half()
    with pytest.raises(RuntimeError, match="more than the 4 tokens"):
        U._npu_flash_attention_unpad(h, h, h, torch.tensor([3, 3]), 1.0, 2, 2, torch.zeros_like(h))
    with pytest.raises(RuntimeError, match="must be a multiple of num_kv_heads"):
        U._npu_flash_attention_unpad(h, h, h, torch.tensor([4]), 1.0, 2, 3, torch.zeros_like(h))


def test_paged_cache_load_reads_each_sequence_from_its_start():
    key_cache, value_cache = torch.randn(4, 2, 1, 8), torch.randn(4, 2, 1, 4)
    table = torch.tensor([[3, 1, 0], [2, 0, 1]], dtype=torch.int32)
    key, value = torch.zeros(5, 1, 8), torch.zeros(5, 1, 4)
    P.npu_paged_cache_load_out(key_cache, value_cache, table, torch.tensor([3, 2], dtype=torch.int32),
                               seq_starts=torch.tensor([1, 2], dtype=torch.int32), key=key, value=value)
    row = 0
    for b, (n, start) in enumerate([(3, 1), (2, 2)]):
        for j in range(n):
            p = start + j
            assert torch.equal(key[row], key_cache[int(table[b, p // 2]), p % 2])
            assert torch.equal(value[row], value_cache[int(table[b, p // 2]), p % 2])
            row += 1
    k2, v2 = torch.zeros(5, 1, 8), torch.zeros(5, 1, 4)       # cumulative lengths, batch + 1 form
    P.npu_paged_cache_load_out(key_cache, value_cache, table, torch.tensor([0, 3, 5], dtype=torch.int32),
                               seq_starts=torch.tensor([1, 2], dtype=torch.int32), cumsum=True, key=k2, value=v2)
    assert torch.equal(k2, key) and torch.equal(v2, value)
    with pytest.raises(RuntimeError, match="past its 3 blocks"):
        P.npu_paged_cache_load_out(key_cache, value_cache, table, torch.tensor([3, 2], dtype=torch.int32),
                                   seq_starts=torch.tensor([4, 0], dtype=torch.int32), key=key, value=value)


def test_paged_attention_workspace_feeds_paged_attention(npugraph):
    import torch_npu

    query = torch.randn(2, 4, 8).npu()
    caches = torch.randn(3, 4, 2, 8).npu(), torch.randn(3, 4, 2, 8).npu()
    table = torch.tensor([[0, 1], [2, 0]], dtype=torch.int32).npu()
    lens = torch.tensor([5, 3], dtype=torch.int32)
    out, ref = torch.zeros(2, 4, 8).npu(), torch.zeros(2, 4, 8).npu()
    workspace = torch_npu._npu_paged_attention_get_workspace(query=query, key_cache=caches[0], value_cache=caches[1],
                                                             num_kv_heads=2, num_heads=4, scale_value=0.3,
                                                             block_table=table, context_lens=lens, out=out)
    assert workspace.dtype == torch.uint8 and workspace.device.type == "npu"
    torch_npu._npu_paged_attention(query, caches[0], caches[1], 2, 4, 0.3, table, lens, out=out, workspace=workspace)
    torch_npu._npu_paged_attention(query, caches[0], caches[1], 2, 4, 0.3, table, lens, out=ref)
    assert torch.equal(out.cpu(), ref.cpu())
    npugraph.assert_clean()


def test_on_npu_unpad_and_cache_load_are_atb_kernels(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    q = torch.randn(3, 2, 8, dtype=torch.float16)
    out = torch.zeros_like(q).npu()
    torch_npu._npu_flash_attention_unpad(query=q.npu(), key=q.npu(), value=q.npu(), seq_len=torch.tensor([3]),
                                         scale_value=0.3, num_heads=2, num_kv_heads=2, out=out)
    torch.testing.assert_close(out.cpu().double(), loop_attention(q, q, q, [3], 0.3, 1), atol=2e-3, rtol=2e-3)
    key, value = torch.zeros(2, 1, 8).npu(), torch.zeros(2, 1, 8).npu()
    cache = torch.randn(2, 2, 1, 8)
    torch_npu.atb.npu_paged_cache_load(cache.npu(), cache.npu(), torch.tensor([[1, 0]], dtype=torch.int32).npu(),
                                       torch.tensor([2], dtype=torch.int32).npu(), key=key, value=value)
    assert torch.equal(key.cpu(), cache[1])
    kinds = {r.op: r.cores.kind for r in npugraph.trace.records if type(r) is Kernel
             and ("unpad" in r.op or "cache_load" in r.op)}
    assert len(kinds) == 2 and set(kinds.values()) == {"ATB"}, kinds
    npugraph.assert_clean()
