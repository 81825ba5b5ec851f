"""DeepSeek Multi-head Latent Attention pre-processing: npu_mla_prolog_v2, npu_mla_prolog_v3(_functional).

vLLM-Ascend's and TorchAir's DeepSeek-V3 decode paths call these before the attention kernel.  The
computation (CANN MlaProlog docs and torch_npu's own op test), with x of shape (T, He) or (B, S, He):

    c_q   = qc_qr_scale * RmsNorm(x @ W_dq) * gamma_cq                 (T, Hcq)
    q     = (c_q @ W_uq_qr).view(T, N, D + Dr);  q_c, q_r = q[..., :D], q[..., D:]
    query = q_c @ W_uk[n] per head                                       (T, N, Hckv)
    query_rope = rope(q_r, cos, sin)                                     (T, N, Dr)
    kv, kr = (x @ W_dkv_kr)[:, :Hckv], (x @ W_dkv_kr)[:, Hckv:]
    kv_cache[slot] = kc_scale * RmsNorm(kv) * gamma_ckv;   kr_cache[slot] = rope(kr, cos, sin)

where ``rope`` is DeepSeek's interleaved RoPE (pairs de-interleaved, then rotated by halves, as
``npu_interleave_rope``), and slot ``cache_index[t]`` is a row of the (BlockNum * BlockSize) cache,
written for every KV head (negative: not written).  qc_qr_scale and kc_scale exist from v3 on (1 in v2).

v2 writes kv_cache/kr_cache in place although its schema does not declare it (the docs say so and
recommend v3) and returns copies of them; v3 declares the writes (``Tensor(a!) kv_cache, Tensor(b!)
kr_cache``); v3_functional returns the new caches after v3's outputs.  Quantised variants (int8 /
fp8 / hifloat8 inputs, dequant/quant scales, non-zero quant modes) are not emulated.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._common import _check, _unsupported
from .spec import OpSpec, mix




def _rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * gamma.float()


def _interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xs = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    first, second = xs.chunk(2, dim=-1)
    return xs * cos + torch.cat((-second, first), dim=-1) * sin


def _check_ranks(op: str, token_x, weight_uk, rope_sin, v3: bool) -> None:
    """The wheel's meta-kernel checks (messages verbatim)."""
    dim = token_x.dim()
    _check(dim in (2, 3), lambda: f"token_x dim num should be 2 or 3, but the actual value is {dim}")
    _check(weight_uk.dim() == 3, lambda: f"weight_uk dim num should be 3, but the actual value is {weight_uk.dim()}")
    if not v3:
        _check(rope_sin.dim() in (2, 3),
               lambda: f"rope_sin dim num should be 2 or 3, but the actual value is {rope_sin.dim()}")
    else:
        _check(rope_sin.dim() == dim, lambda: f"when token_x dim num is {dim}, rope_sin dim num should be {dim}, "
                                              f"but the actual value is {rope_sin.dim()}")


def _prolog(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
            rope_sin, rope_cos, cache_index, kv_cache, kr_cache, eps_cq, eps_ckv, cache_mode, qc_qr_scale=1.0,
            kc_scale=1.0):
    """(query, query_rope, c_q) in float32; writes kv_cache/kr_cache in place."""
    _check(cache_mode in ("PA_BSND", "PA_NZ"),
           lambda: f"{op}: cache_mode only supports PA_BSND and PA_NZ, but got {cache_mode}")
    if token_x.dtype in (torch.int8, torch.uint8) or weight_uq_qr.dtype == torch.int8 or kv_cache.dtype == torch.int8:
        raise _unsupported(op, "quantised inputs or caches")
    if kv_cache.dim() != 4 or kr_cache.dim() != 4:
        raise _unsupported(op, "caches not of rank 4 (an NZ storage shape)")
    lead = token_x.shape[:-1]
    x = token_x.reshape(-1, token_x.size(-1)).float()
    tokens = x.size(0)
    heads, d_nope, h_ckv = weight_uk.shape
    d_rope = rope_sin.size(-1)
    cos, sin = rope_cos.reshape(tokens, d_rope).float(), rope_sin.reshape(tokens, d_rope).float()
    c_q = qc_qr_scale * _rms_norm(x @ weight_dq.float(), rmsnorm_gamma_cq, eps_cq)
    q = (c_q @ weight_uq_qr.float()).reshape(tokens, heads, d_nope + d_rope)
    query = torch.einsum("tnd,ndh->tnh", q[..., :d_nope], weight_uk.float())
    query_rope = _interleaved_rope(q[..., d_nope:], cos.unsqueeze(1), sin.unsqueeze(1))
    kv_kr = x @ weight_dkv_kr.float()
    _check(kv_kr.size(-1) == h_ckv + d_rope, lambda: f"{op}: weight_dkv_kr must have Hckv + Dr = {h_ckv + d_rope} "
                                                     f"columns, but has {kv_kr.size(-1)}")
    c_kv = kc_scale * _rms_norm(kv_kr[:, :h_ckv], rmsnorm_gamma_ckv, eps_ckv)
    k_rope = _interleaved_rope(kv_kr[:, h_ckv:], cos, sin)
    if cache_index is not None:
        slots = cache_index.reshape(-1).to(torch.int64)
        keep = slots >= 0
        kv_rows = kv_cache.view(-1, kv_cache.size(2), kv_cache.size(3))
        kr_rows = kr_cache.view(-1, kr_cache.size(2), kr_cache.size(3))
        kv_rows[slots[keep]] = c_kv[keep].unsqueeze(1).to(kv_cache.dtype)
        kr_rows[slots[keep]] = k_rope[keep].unsqueeze(1).to(kr_cache.dtype)
    return (query.reshape(*lead, heads, h_ckv), query_rope.reshape(*lead, heads, d_rope), c_q.reshape(*lead, -1))


_QUANT_ARGS = ("dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_uq_qr", "dequant_scale_w_dkv_kr",
               "quant_scale_ckv", "quant_scale_ckr", "smooth_scales_cq")


def _no_quant(op: str, values: dict) -> None:
    given = [name for name, value in values.items() if value is not None]
    if given:
        raise _unsupported(op, "quantisation arguments " + ", ".join(given))


def npu_mla_prolog_v2(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                      rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *, dequant_scale_x=None,
                      dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None, dequant_scale_w_dkv_kr=None,
                      quant_scale_ckv=None, quant_scale_ckr=None, smooth_scales_cq=None,
                      rmsnorm_epsilon_cq: float = 1e-05, rmsnorm_epsilon_ckv: float = 1e-05,
                      cache_mode: str = "PA_BSND"):
    """Returns (query, query_rope, kv_cache_out, kr_cache_out, dequant_scale_q_nope); caches written in place."""
    op = "npu_mla_prolog_v2"
    _check_ranks(op, token_x, weight_uk, rope_sin, v3=False)
    _no_quant(op, dict(zip(_QUANT_ARGS, (dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr,
                                         dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq))))
    query, query_rope, _ = _prolog(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                   rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache,
                                   rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode)
    return (query.to(rope_sin.dtype), query_rope.to(torch.bfloat16), kv_cache.clone(), kr_cache.clone(),
            torch.zeros(1, dtype=torch.float32))


def _v3_checks(op, token_x, weight_uk, rope_sin, cache_index, quant, modes, dtypes, actual_seq_len, k_nope_clip_alpha):
    _check_ranks(op, token_x, weight_uk, rope_sin, v3=True)
    _no_quant(op, quant)
    if any(modes):
        raise _unsupported(op, "weight/kv_cache/query quant modes and repo modes other than 0")
    if any(d is not None for d in dtypes):
        raise _unsupported(op, "the *_dtype arguments (hifloat8 inputs)")
    if actual_seq_len is not None or k_nope_clip_alpha is not None:
        raise _unsupported(op, "actual_seq_len / k_nope_clip_alpha")
    if cache_index is None:
        raise _unsupported(op, "a call without cache_index")


def _v3_outputs(query, query_rope, c_q, query_norm_flag, weight_uq_qr):
    """v3's five outputs (non-quantised: the dequant scales and an unrequested query_norm are empty)."""
    empty = torch.empty(0, dtype=torch.float32)
    norm = c_q.to(weight_uq_qr.dtype) if query_norm_flag else torch.empty(0, dtype=weight_uq_qr.dtype)
    return query.to(torch.bfloat16), query_rope.to(torch.bfloat16), empty, norm, empty.clone()


def npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                      rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None, dequant_scale_x=None,
                      dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None, dequant_scale_w_dkv_kr=None,
                      quant_scale_ckv=None, quant_scale_ckr=None, smooth_scales_cq=None, actual_seq_len=None,
                      k_nope_clip_alpha=None, rmsnorm_epsilon_cq: float = 1e-05, rmsnorm_epsilon_ckv: float = 1e-05,
                      cache_mode: str = "PA_BSND", query_norm_flag: bool = False, weight_quant_mode: int = 0,
                      kv_cache_quant_mode: int = 0, query_quant_mode: int = 0, ckvkr_repo_mode: int = 0,
                      quant_scale_repo_mode: int = 0, tile_size: int = 128, qc_qr_scale: float = 1.0,
                      kc_scale: float = 1.0, token_x_dtype: Optional[int] = None, weight_dq_dtype: Optional[int] = None,
                      weight_uq_qr_dtype: Optional[int] = None, weight_dkv_kr_dtype: Optional[int] = None,
                      kv_cache_dtype: Optional[int] = None):
    """In place on kv_cache/kr_cache (declared); returns (query, query_rope, dequant_scale_q_nope, query_norm,
    dequant_scale_q_norm)."""
    op = "npu_mla_prolog_v3"
    _v3_checks(op, token_x, weight_uk, rope_sin, cache_index,
               dict(zip(_QUANT_ARGS, (dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr,
                                      dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq))),
               (weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode, quant_scale_repo_mode),
               (token_x_dtype, weight_dq_dtype, weight_uq_qr_dtype, weight_dkv_kr_dtype, kv_cache_dtype),
               actual_seq_len, k_nope_clip_alpha)
    query, query_rope, c_q = _prolog(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                     rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache,
                                     rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode, qc_qr_scale, kc_scale)
    return _v3_outputs(query, query_rope, c_q, query_norm_flag, weight_uq_qr)


def npu_mla_prolog_v3_functional(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                 rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None,
                                 dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                                 dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                                 smooth_scales_cq=None, actual_seq_len=None, k_nope_clip_alpha=None,
                                 rmsnorm_epsilon_cq: float = 1e-05, rmsnorm_epsilon_ckv: float = 1e-05,
                                 cache_mode: str = "PA_BSND", query_norm_flag: bool = False,
                                 weight_quant_mode: int = 0, kv_cache_quant_mode: int = 0, query_quant_mode: int = 0,
                                 ckvkr_repo_mode: int = 0, quant_scale_repo_mode: int = 0, tile_size: int = 128,
                                 qc_qr_scale: float = 1.0, kc_scale: float = 1.0, token_x_dtype: Optional[int] = None,
                                 weight_dq_dtype: Optional[int] = None, weight_uq_qr_dtype: Optional[int] = None,
                                 weight_dkv_kr_dtype: Optional[int] = None, kv_cache_dtype: Optional[int] = None):
    """Out of place: v3's five outputs, then the new kv_cache and kr_cache; the inputs are unchanged."""
    op = "npu_mla_prolog_v3_functional"
    _v3_checks(op, token_x, weight_uk, rope_sin, cache_index,
               dict(zip(_QUANT_ARGS, (dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr,
                                      dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq))),
               (weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode, quant_scale_repo_mode),
               (token_x_dtype, weight_dq_dtype, weight_uq_qr_dtype, weight_dkv_kr_dtype, kv_cache_dtype),
               actual_seq_len, k_nope_clip_alpha)
    new_kv, new_kr = kv_cache.clone(), kr_cache.clone()
    query, query_rope, c_q = _prolog(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                     rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, new_kv, new_kr,
                                     rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode, qc_qr_scale, kc_scale)
    return _v3_outputs(query, query_rope, c_q, query_norm_flag, weight_uq_qr) + (new_kv, new_kr)


# ----------------------------------------------------------------------------- meta (shapes only)
def _shapes(token_x, weight_uk, rope_sin):
    lead = list(token_x.shape[:-1])
    return lead + [weight_uk.size(0), weight_uk.size(2)], lead + [weight_uk.size(0), rope_sin.size(-1)]


def _v2_meta(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
             rope_sin, rope_cos, cache_index, kv_cache, kr_cache, **_):
    _check_ranks("npu_mla_prolog_v2", token_x, weight_uk, rope_sin, v3=False)
    q_shape, r_shape = _shapes(token_x, weight_uk, rope_sin)
    return (token_x.new_empty(q_shape, dtype=rope_sin.dtype), token_x.new_empty(r_shape, dtype=torch.bfloat16),
            torch.empty_like(kv_cache), torch.empty_like(kr_cache), token_x.new_empty([1], dtype=torch.float32))


def _v3_meta_outputs(token_x, weight_dq, weight_uq_qr, weight_uk, rope_sin, query_norm_flag):
    _check_ranks("npu_mla_prolog_v3", token_x, weight_uk, rope_sin, v3=True)
    q_shape, r_shape = _shapes(token_x, weight_uk, rope_sin)
    norm_shape = list(token_x.shape[:-1]) + [weight_dq.size(1)] if query_norm_flag else [0]
    return (token_x.new_empty(q_shape, dtype=torch.bfloat16), token_x.new_empty(r_shape, dtype=torch.bfloat16),
            token_x.new_empty([0], dtype=torch.float32), token_x.new_empty(norm_shape, dtype=weight_uq_qr.dtype),
            token_x.new_empty([0], dtype=torch.float32))


def _v3_meta(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
             rope_sin, rope_cos, kv_cache, kr_cache, *, query_norm_flag=False, **_):
    return _v3_meta_outputs(token_x, weight_dq, weight_uq_qr, weight_uk, rope_sin, query_norm_flag)


def _v3_functional_meta(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                        rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, *, query_norm_flag=False, **_):
    return (_v3_meta_outputs(token_x, weight_dq, weight_uq_qr, weight_uk, rope_sin, query_norm_flag)
            + (torch.empty_like(kv_cache), torch.empty_like(kr_cache)))


_V2_KW = ("*, Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, "
          "Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, "
          "Tensor? smooth_scales_cq=None, float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, "
          "str cache_mode=\"PA_BSND\"")
_V3_KW = ("*, Tensor? cache_index=None, Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, "
          "Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, "
          "Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, Tensor? actual_seq_len=None, "
          "Tensor? k_nope_clip_alpha=None, float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, "
          "str cache_mode=\"PA_BSND\", bool query_norm_flag=False, int weight_quant_mode=0, "
          "int kv_cache_quant_mode=0, int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, "
          "int tile_size=128, float qc_qr_scale=1.0, float kc_scale=1.0, int? token_x_dtype=None, "
          "int? weight_dq_dtype=None, int? weight_uq_qr_dtype=None, int? weight_dkv_kr_dtype=None, "
          "int? kv_cache_dtype=None")
_HEAD = ("Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, Tensor weight_dkv_kr, "
         "Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, Tensor rope_cos, ")

SPECS = [
    OpSpec(f"npu_mla_prolog_v2({_HEAD}Tensor cache_index, Tensor kv_cache, Tensor kr_cache, {_V2_KW}) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor)", npu_mla_prolog_v2, mix(), meta=_v2_meta),
    OpSpec(f"npu_mla_prolog_v3({_HEAD}Tensor(a!) kv_cache, Tensor(b!) kr_cache, {_V3_KW}) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor)", npu_mla_prolog_v3, mix(), meta=_v3_meta),
    # TorchAir's reinplace pass turns the functional form back into v3, writing arguments 9 and 10.
    OpSpec(f"npu_mla_prolog_v3_functional({_HEAD}Tensor kv_cache, Tensor kr_cache, {_V3_KW}) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", npu_mla_prolog_v3_functional, mix(),
           meta=_v3_functional_meta, reinplace=("npu_mla_prolog_v3", (9, 10))),
]
