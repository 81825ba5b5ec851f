"""npu_mla_prolog_v2/v3 against a step-by-step MLA pre-processing written with explicit per-head loops."""
from __future__ import annotations

import re

import pytest
import torch

from pytest_npugraph.runtime.ops import mla as M

T, HE, HCQ, N, D, DR, HCKV, BLOCKS, BLOCK = 3, 16, 12, 2, 4, 4, 8, 2, 4


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(5)


def close(a, b, tol=1e-4):
    torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=tol)


def inputs(batched=False):
    x = torch.randn(T, HE)
    args = dict(
        token_x=x.reshape(1, T, HE) if batched else x, weight_dq=torch.randn(HE, HCQ) / 4,
        weight_uq_qr=torch.randn(HCQ, N * (D + DR)) / 4, weight_uk=torch.randn(N, D, HCKV) / 2,
        weight_dkv_kr=torch.randn(HE, HCKV + DR) / 4, rmsnorm_gamma_cq=torch.rand(HCQ) + 0.5,
        rmsnorm_gamma_ckv=torch.rand(HCKV) + 0.5)
    cos, sin = torch.rand(T, DR), torch.rand(T, DR)
    args["rope_sin"], args["rope_cos"] = (sin.reshape(1, T, DR), cos.reshape(1, T, DR)) if batched else (sin, cos)
    return args


def caches():
    return torch.zeros(BLOCKS, BLOCK, 1, HCKV), torch.zeros(BLOCKS, BLOCK, 1, DR)


def rope_pairs(v, cos, sin):
    """DeepSeek rope: view (Dr/2, 2), transpose, then out = v*cos + rotate_half(v)*sin, element by element."""
    v = v.reshape(*v.shape[:-1], DR // 2, 2).transpose(-1, -2).reshape(*v.shape)
    h = DR // 2
    out = torch.empty_like(v)
    out[..., :h] = v[..., :h] * cos[..., :h] - v[..., h:] * sin[..., :h]
    out[..., h:] = v[..., h:] * cos[..., h:] + v[..., :h] * sin[..., h:]
    return out


def expected(a, qc_qr_scale=1.0, kc_scale=1.0, eps=1e-5):
    x = a["token_x"].reshape(T, HE).double()
    cos, sin = a["rope_cos"].reshape(T, DR).double(), a["rope_sin"].reshape(T, DR).double()
    cq = x @ a["weight_dq"].double()
    cq = qc_qr_scale * cq / torch.sqrt((cq ** 2).mean(-1, keepdim=True) + eps) * a["rmsnorm_gamma_cq"].double()
    q = (cq @ a["weight_uq_qr"].double()).reshape(T, N, D + DR)
    query = torch.stack([q[:, n, :D] @ a["weight_uk"][n].double() for n in range(N)], dim=1)
    query_rope = torch.stack([rope_pairs(q[:, n, D:], cos, sin) for n in range(N)], dim=1)
    kvkr = x @ a["weight_dkv_kr"].double()
    kv = kvkr[:, :HCKV]
    ckv = kc_scale * kv / torch.sqrt((kv ** 2).mean(-1, keepdim=True) + eps) * a["rmsnorm_gamma_ckv"].double()
    kr = rope_pairs(kvkr[:, HCKV:], cos, sin)
    return query, query_rope, ckv, kr, cq


def test_v2_math_and_cache_writes_in_place():
    a = inputs()
    kv_cache, kr_cache = caches()
    slots = torch.tensor([5, 0, 7])
    query, query_rope, kv_out, kr_out, scale = M.npu_mla_prolog_v2(**a, cache_index=slots, kv_cache=kv_cache,
                                                                   kr_cache=kr_cache)
    e_query, e_rope, e_ckv, e_kr, _ = expected(a)
    close(query, e_query)
    assert query_rope.dtype == torch.bfloat16
    close(query_rope, e_rope, tol=2e-2)
    rows_kv, rows_kr = kv_cache.view(-1, HCKV), kr_cache.view(-1, DR)
    for t, slot in enumerate(slots.tolist()):
        close(rows_kv[slot], e_ckv[t])
        close(rows_kr[slot], e_kr[t])
    assert rows_kv[[1, 2, 3, 4, 6]].abs().sum() == 0
    assert torch.equal(kv_out, kv_cache) and torch.equal(kr_out, kr_cache)     # v2 writes its caches too
    assert scale.shape == (1,)


def test_v3_scales_query_norm_and_batched_shapes():
    a = inputs(batched=True)
    kv_cache, kr_cache = caches()
    out = M.npu_mla_prolog_v3(**a, kv_cache=kv_cache, kr_cache=kr_cache, cache_index=torch.tensor([[1, 2, 3]]),
                              query_norm_flag=True, qc_qr_scale=0.5, kc_scale=2.0)
    query, query_rope, deq_nope, query_norm, deq_norm = out
    e_query, e_rope, e_ckv, _, e_cq = expected(a, qc_qr_scale=0.5, kc_scale=2.0)
    assert query.shape == (1, T, N, HCKV) and query.dtype == torch.bfloat16
    close(query.reshape(T, N, HCKV), e_query, tol=3e-2)
    close(query_norm.reshape(T, HCQ), e_cq)
    close(kv_cache.view(-1, HCKV)[1:4], e_ckv)
    assert deq_nope.shape == (0,) and deq_norm.shape == (0,)
    plain = M.npu_mla_prolog_v3(**a, kv_cache=caches()[0], kr_cache=caches()[1], cache_index=torch.tensor([[1, 2, 3]]))
    assert plain[3].shape == (0,)                                    # query_norm only with query_norm_flag


def test_v3_functional_leaves_its_caches_and_matches_v3():
    a = inputs()
    kv0, kr0 = caches()
    out = M.npu_mla_prolog_v3_functional(**a, kv_cache=kv0, kr_cache=kr0, cache_index=torch.tensor([2, 4, 6]))
    assert kv0.abs().sum() == 0 and kr0.abs().sum() == 0 and len(out) == 7
    kv1, kr1 = caches()
    ref = M.npu_mla_prolog_v3(**a, kv_cache=kv1, kr_cache=kr1, cache_index=torch.tensor([2, 4, 6]))
    close(out[5], kv1)
    close(out[6], kr1)
    for got, want in zip(out[:2], ref[:2]):
        close(got, want)


def test_meta_errors_and_shapes():
    a = inputs()
    kv_cache, kr_cache = caches()
    with pytest.raises(RuntimeError, match=re.escape("token_x dim num should be 2 or 3, but the actual value is 1")):
        M.npu_mla_prolog_v2(**{**a, "token_x": a["token_x"][0]}, cache_index=torch.arange(3), kv_cache=kv_cache,
                            kr_cache=kr_cache)
    with pytest.raises(RuntimeError, match=re.escape("weight_uk dim num should be 3, but the actual value is 2")):
        M.npu_mla_prolog_v3(**{**a, "weight_uk": a["weight_uk"][0]}, kv_cache=kv_cache, kr_cache=kr_cache,
                            cache_index=torch.arange(3))
    with pytest.raises(RuntimeError, match=re.escape(
            "when token_x dim num is 2, rope_sin dim num should be 2, but the actual value is 3")):
        M.npu_mla_prolog_v3(**{**a, "rope_sin": a["rope_sin"][None]}, kv_cache=kv_cache, kr_cache=kr_cache,
                            cache_index=torch.arange(3))
    with pytest.raises(NotImplementedError, match="quantisation arguments quant_scale_ckv"):
        M.npu_mla_prolog_v3(**a, kv_cache=kv_cache, kr_cache=kr_cache, cache_index=torch.arange(3),
                            quant_scale_ckv=torch.ones(1, HCKV))
    meta = {k: v.to("meta") for k, v in a.items()}
    shapes = [tuple(t.shape) for t in M._v3_functional_meta(**meta, kv_cache=kv_cache.to("meta"),
                                                            kr_cache=kr_cache.to("meta"), query_norm_flag=True)]
    assert shapes == [(T, N, HCKV), (T, N, DR), (0,), (T, HCQ), (0,), tuple(kv_cache.shape), tuple(kr_cache.shape)]
    shapes = [tuple(t.shape) for t in M._v2_meta(*meta.values(), None, kv_cache.to("meta"), kr_cache.to("meta"))]
    assert shapes == [(T, N, HCKV), (T, N, DR), tuple(kv_cache.shape), tuple(kr_cache.shape), (1,)]


def test_v3_on_npu_writes_the_cache_and_records_a_mixed_kernel(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    a = inputs()
    kv_cache, kr_cache = (c.npu() for c in caches())
    torch_npu.npu_mla_prolog_v3(**{k: v.npu() for k, v in a.items()}, kv_cache=kv_cache, kr_cache=kr_cache,
                                cache_index=torch.tensor([0, 1, 2]).npu())
    close(kv_cache.cpu().view(-1, HCKV)[:3], expected(a)[2])
    (k,) = [r for r in npugraph.trace.records if isinstance(r, Kernel) and "npu_mla_prolog_v3" in r.op]
    assert k.cores.kind == "AICore" and k.writes
    npugraph.assert_clean()
