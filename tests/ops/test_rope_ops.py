"""Rotary ops against element-wise formulas written out independently of the implementation."""
from __future__ import annotations

import re

import pytest
import torch

from pytest_npugraph.runtime.ops import rope as R


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(11)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=tol)


def half_rope(x, cos, sin):
    """out[i] = x[i] cos[i] - x[i+h] sin[i]; out[i+h] = x[i+h] cos[i+h] + x[i] sin[i+h]."""
    h = x.size(-1) // 2
    out = torch.empty_like(x)
    out[..., :h] = x[..., :h] * cos[..., :h] - x[..., h:] * sin[..., :h]
    out[..., h:] = x[..., h:] * cos[..., h:] + x[..., :h] * sin[..., h:]
    return out


def pair_rope(x, cos, sin):
    """out[2j] = x[2j] cos[2j] - x[2j+1] sin[2j]; out[2j+1] = x[2j+1] cos[2j+1] + x[2j] sin[2j+1]."""
    out = torch.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos[..., 0::2] - x[..., 1::2] * sin[..., 0::2]
    out[..., 1::2] = x[..., 1::2] * cos[..., 1::2] + x[..., 0::2] * sin[..., 1::2]
    return out


def deepseek_rope(x, cos, sin):
    """HF DeepSeek-V2/V3 apply_rotary_pos_emb: de-interleave (view d/2 x 2, transpose), then rotate halves."""
    b, h, s, d = x.shape
    return half_rope(x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d), cos, sin)


# ============================================================================ apply_rotary_pos_emb
@pytest.mark.parametrize("layout, q_shape, k_shape, cs_shape", [
    ("BSND", (2, 3, 4, 8), (2, 3, 2, 8), (2, 3, 1, 8)),
    ("TND", (5, 4, 8), (5, 1, 8), (5, 1, 8)),
    ("BNSD", (2, 4, 3, 8), (2, 2, 3, 8), (2, 1, 3, 8)),
])
def test_apply_rotary_pos_emb_half_updates_query_and_key_in_place(layout, q_shape, k_shape, cs_shape):
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    cos, sin = torch.rand(cs_shape), torch.rand(cs_shape)
    want_q, want_k = half_rope(q, cos, sin), half_rope(k, cos, sin)
    q_out, k_out = R.npu_apply_rotary_pos_emb(q, k, cos, sin, layout)
    close(q_out, want_q)
    close(k_out, want_k)
    close(q, want_q)          # the kernel writes its query/key arguments
    close(k, want_k)


def test_apply_rotary_pos_emb_interleave_and_partial_rotary_dim():
    q, k = torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    cos, sin = torch.rand(1, 2, 1, 8), torch.rand(1, 2, 1, 8)
    q_out, _ = R.npu_apply_rotary_pos_emb(q.clone(), k.clone(), cos, sin, "BSND", "interleave")
    close(q_out, pair_rope(q, cos, sin))
    cos4, sin4 = cos[..., :4], sin[..., :4]                       # rotary dim 4 < head dim 8
    q_out, _ = R.npu_apply_rotary_pos_emb(q.clone(), k.clone(), cos4, sin4, "BSND")
    close(q_out[..., :4], half_rope(q[..., :4], cos4, sin4))
    close(q_out[..., 4:], q[..., 4:])


def test_apply_rotary_pos_emb_half_precision_and_errors():
    q = torch.randn(1, 2, 2, 8, dtype=torch.bfloat16)
    cos, sin = torch.rand(1, 2, 1, 8, dtype=torch.bfloat16), torch.rand(1, 2, 1, 8, dtype=torch.bfloat16)
    q_out, _ = R.npu_apply_rotary_pos_emb(q.clone(), q.clone(), cos, sin)
    assert q_out.dtype == torch.bfloat16
    close(q_out, half_rope(q.float(), cos.float(), sin.float()), tol=1e-2)
    with pytest.raises(RuntimeError, match="layout only supports"):
        R.npu_apply_rotary_pos_emb(q, q, cos, sin, "XYZ")
    with pytest.raises(RuntimeError, match="must be 3-dimensional for layout TND"):
        R.npu_apply_rotary_pos_emb(q, q, cos, sin, "TND")
    with pytest.raises(NotImplementedError, match="quarter"):
        R.npu_apply_rotary_pos_emb(q, q, cos, sin, "BSND", "quarter")


# ============================================================================ interleave_rope
def test_interleave_rope_is_deepseeks_rotary():
    x = torch.randn(2, 3, 4, 8)
    cos, sin = torch.rand(2, 1, 4, 8), torch.rand(2, 1, 4, 8)
    out = R.npu_interleave_rope(x, cos, sin)
    close(out, deepseek_rope(x, cos, sin))
    assert out.shape == x.shape
    with pytest.raises(RuntimeError, match="x must be 4-dimensional"):
        R.npu_interleave_rope(x[0], cos, sin)


# ============================================================================ kv_rmsnorm_rope_cache
def kv_inputs(batch=2, seq=3, rms=8, rope=4, dtype=torch.float32):
    kv = torch.randn(batch, 1, seq, rms + rope, dtype=dtype)
    gamma = torch.rand(rms, dtype=dtype)
    cos, sin = torch.rand(batch, 1, seq, rope, dtype=dtype), torch.rand(batch, 1, seq, rope, dtype=dtype)
    return kv, gamma, cos, sin


def expected_parts(kv, gamma, cos, sin, eps=1e-5):
    rms = gamma.numel()
    a = kv[..., :rms].double()
    y = a / torch.sqrt((a * a).sum(-1, keepdim=True) / rms + eps) * gamma.double()
    return deepseek_rope(kv[..., rms:].double(), cos.double(), sin.double()), y


def test_paged_cache_write_and_outputs():
    kv, gamma, cos, sin = kv_inputs()
    k_cache, ckv_cache = torch.zeros(4, 2, 1, 4), torch.zeros(4, 2, 1, 8)
    index = torch.tensor([7, 0, 3, 2, -1, 5])                     # token (b, s) -> slot; -1 writes nothing
    k_out, ckv_out, k_embed, y = R.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                                            cache_mode="PA_BNSD", is_output_kv=True)
    want_k, want_y = expected_parts(kv, gamma, cos, sin)
    close(k_embed, want_k)
    close(y, want_y)
    flat_k, flat_c = k_cache.view(8, 4), ckv_cache.view(8, 8)
    for t, slot in enumerate(index.tolist()):
        b, s = divmod(t, 3)
        if slot >= 0:
            close(flat_k[slot], want_k[b, 0, s])
            close(flat_c[slot], want_y[b, 0, s])
    assert flat_k[[1, 4, 6]].abs().sum() == 0                      # untouched slots (1, 4, 6)
    assert torch.equal(k_out, k_cache) and torch.equal(ckv_out, ckv_cache)   # v1 writes in place too


def test_norm_and_block_cache_modes():
    kv, gamma, cos, sin = kv_inputs(batch=2, seq=2)
    k_cache, ckv_cache = torch.zeros(2, 1, 5, 4), torch.zeros(2, 1, 5, 8)
    index = torch.tensor([[3, 4], [0, 1]])                         # per-batch offsets
    R.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode="Norm")
    want_k, want_y = expected_parts(kv, gamma, cos, sin)
    close(k_cache[0, 0, 3:5], want_k[0, 0])
    close(ckv_cache[1, 0, 0:2], want_y[1, 0])
    assert k_cache[0, 0, :3].abs().sum() == 0
    # PA_BLK_BNSD: index holds the first slot of each batch's block of block_size tokens
    k_blk, c_blk = torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 8)
    R.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, torch.tensor([4, 0]), k_blk, c_blk, cache_mode="PA_BLK_BNSD")
    close(k_blk.view(6, 4)[4:6], want_k[0, 0])
    close(c_blk.view(6, 8)[0:2], want_y[1, 0])


def test_v2_writes_its_declared_caches_and_functional_leaves_them():
    kv, gamma, cos, sin = kv_inputs()
    index = torch.arange(6)
    k_cache, ckv_cache = torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 8)
    k_embed, y = R.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode="PA")
    want_k, want_y = expected_parts(kv, gamma, cos, sin)
    close(k_cache.view(6, 4), want_k[:, 0].reshape(6, 4))
    close(ckv_cache.view(6, 8), want_y[:, 0].reshape(6, 8))
    k0, c0 = torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 8)
    f_k, f_y, new_k, new_c = R.npu_kv_rmsnorm_rope_cache_v2_functional(kv, gamma, cos, sin, index, k0, c0,
                                                                       cache_mode="PA")
    assert k0.abs().sum() == 0 and c0.abs().sum() == 0
    close(new_k, k_cache)
    close(new_c, ckv_cache)
    close(f_k, k_embed)
    close(f_y, y)


def test_kv_rmsnorm_rope_cache_errors_are_the_meta_kernels():
    kv, gamma, cos, sin = kv_inputs()
    caches = (torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 8))
    with pytest.raises(RuntimeError, match=re.escape("4D tensor expected for input kv")):
        R.npu_kv_rmsnorm_rope_cache(kv[0], gamma, cos, sin, torch.arange(6), *caches)
    with pytest.raises(RuntimeError, match=re.escape("1D tensor expected for input gamma")):
        R.npu_kv_rmsnorm_rope_cache(kv, gamma[None], cos, sin, torch.arange(6), *caches)
    with pytest.raises(RuntimeError, match=re.escape("v MUST have same data type as kv!")):
        R.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, torch.arange(6), *caches, v=kv.half())
    with pytest.raises(NotImplementedError, match="quantised caches"):
        R.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, torch.arange(6), *caches, k_rope_scale=torch.ones(4))


def test_meta_shapes():
    kv, gamma, cos, sin = (t.to("meta") for t in kv_inputs())
    caches = (torch.empty(3, 2, 1, 4, device="meta"), torch.empty(3, 2, 1, 8, device="meta"))
    shapes = [tuple(t.shape) for t in R._kvrc_meta(kv, gamma, cos, sin, None, *caches)]
    assert shapes == [(3, 2, 1, 4), (3, 2, 1, 8), (2, 1, 3, 4), (2, 1, 3, 8)]
    shapes = [tuple(t.shape) for t in R._kvrc_v2_functional_meta(kv, gamma, cos, sin, None, *caches)]
    assert shapes == [(2, 1, 3, 4), (2, 1, 3, 8), (3, 2, 1, 4), (3, 2, 1, 8)]


# ============================================================================ on the emulated device
def test_on_npu_rope_ops_record_vector_kernels_and_v2_writes_the_caches(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    kv, gamma, cos, sin = kv_inputs()
    k_cache, ckv_cache = torch.zeros(3, 2, 1, 4).npu(), torch.zeros(3, 2, 1, 8).npu()
    k_embed, _ = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*(t.npu() for t in (kv, gamma, cos, sin, torch.arange(6))),
                                                        k_cache, ckv_cache, cache_mode="PA")
    want_k, want_y = expected_parts(kv, gamma, cos, sin)
    close(k_embed.cpu(), want_k, tol=1e-4)
    close(ckv_cache.cpu().view(6, 8), want_y[:, 0].reshape(6, 8), tol=1e-4)
    q = torch.randn(1, 2, 2, 8)
    torch_npu.npu_apply_rotary_pos_emb(q.npu(), q.npu(), torch.rand(1, 2, 1, 8).npu(), torch.rand(1, 2, 1, 8).npu())
    kernels = [r for r in npugraph.trace.records if isinstance(r, Kernel)]
    cache_write = [k for k in kernels if "npu_kv_rmsnorm_rope_cache_v2" in k.op][0]
    assert len(cache_write.writes) >= 2                              # both declared caches are written
    rope_kernel = [k for k in kernels if "npu_apply_rotary_pos_emb" in k.op][0]
    assert rope_kernel.cores.kind == "AIV" and rope_kernel.cores.vector == npugraph.vector_cores
    npugraph.assert_clean()


# ============================================================================ _npu_rotary_embedding
def vllm_rotary_reference(positions, x, head_size, cache, neox):
    """vLLM's rotary_embedding kernel written per element: for token t, head h, i < rot/2:
    neox: (x[i], x[i+rot/2]) -> (x[i] c - x[i+rot/2] s, x[i+rot/2] c + x[i] s); GPT-J: the pair (x[2i], x[2i+1])."""
    rot = cache.size(1)
    half = rot // 2
    out = x.clone().double().reshape(x.size(0), -1, head_size)
    src = x.double().reshape(x.size(0), -1, head_size)
    for t in range(x.size(0)):
        c, s = cache[positions[t], :half].double(), cache[positions[t], half:].double()
        for h in range(src.size(1)):
            for i in range(half):
                a_i, b_i = (i, i + half) if neox else (2 * i, 2 * i + 1)
                out[t, h, a_i] = src[t, h, a_i] * c[i] - src[t, h, b_i] * s[i]
                out[t, h, b_i] = src[t, h, b_i] * c[i] + src[t, h, a_i] * s[i]
    return out.reshape(x.shape)


@pytest.mark.parametrize("neox", [True, False])
def test_npu_rotary_embedding_is_vllms_kernel_in_place(neox):
    positions = torch.tensor([4, 0, 2])
    q, k = torch.randn(3, 2 * 8), torch.randn(3, 1 * 8)
    cache = torch.randn(6, 8)
    want_q = vllm_rotary_reference(positions, q, 8, cache, neox)
    want_k = vllm_rotary_reference(positions, k, 8, cache, neox)
    assert R._npu_rotary_embedding(positions, q, k, 8, cache, neox) is None
    close(q, want_q)
    close(k, want_k)


def test_npu_rotary_embedding_partial_rotary_dim_and_errors():
    positions = torch.tensor([1, 3], dtype=torch.int32)
    q, k = torch.randn(2, 2 * 8, dtype=torch.bfloat16), torch.randn(2, 8, dtype=torch.bfloat16)
    cache = torch.randn(4, 4)                                   # rotary_dim 4 < head_size 8
    want = vllm_rotary_reference(positions, q.float(), 8, cache, True)
    R._npu_rotary_embedding(positions, q, k, 8, cache, True)
    close(q.float(), want.float(), tol=2e-2)
    with pytest.raises(RuntimeError, match="positions must be int32 or int64"):
        R._npu_rotary_embedding(positions.float(), q, k, 8, cache, True)
    with pytest.raises(RuntimeError, match="must be even and at most head_size"):
        R._npu_rotary_embedding(positions, q, k, 2, cache, True)
    with pytest.raises(RuntimeError, match="positions must lie in"):
        R._npu_rotary_embedding(torch.tensor([0, 9]), q, k, 8, cache, True)


def test_npu_rotary_embedding_on_npu_writes_query_and_key(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    positions, cache = torch.tensor([2, 1]), torch.randn(3, 8)
    q, k = torch.randn(2, 16), torch.randn(2, 8)
    qn, kn = q.npu(), k.npu()
    torch_npu._npu_rotary_embedding(positions.npu(), qn, kn, 8, cache.npu(), False)
    close(qn.cpu(), vllm_rotary_reference(positions, q, 8, cache, False))
    close(kn.cpu(), vllm_rotary_reference(positions, k, 8, cache, False))
    kernel = [r for r in npugraph.trace.records if type(r) is Kernel and "rotary_embedding" in r.op][0]
    assert kernel.cores.kind == "ATB" and len(kernel.writes) >= 2
    npugraph.assert_clean()
