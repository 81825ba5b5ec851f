"""Rotary position embedding: npu_apply_rotary_pos_emb, npu_interleave_rope, npu_kv_rmsnorm_rope_cache(_v2),
npu_mrope (vLLM-Ascend's rotary embedding from a cos/sin cache, multimodal sections for Qwen2-VL).

Who calls them: vLLM-Ascend's rotary embedding (``npu_apply_rotary_pos_emb(q, k, cos, sin, "TND")`` for
head size 128), DeepSeek MLA paths (``npu_interleave_rope`` on the rope part of q/k, and
``npu_kv_rmsnorm_rope_cache`` fusing the KV latent's RMSNorm, RoPE and the paged-cache write).

* ``npu_apply_rotary_pos_emb``: ``x*cos + rotate(x)*sin`` on query and key, which the kernel updates
  in place (aclnnApplyRotaryPosEmbV2 writes its query/key arguments; the schema declares no alias).
  The emulator writes query/key in place too and returns copies of the results.
* ``npu_interleave_rope``: DeepSeek's interleaved RoPE: the pairs (x0, x1), (x2, x3), ... are first
  de-interleaved to (x0, x2, ..., x1, x3, ...), then rotated by halves: ``x'*cos + rotate_half(x')*sin``.
* ``npu_kv_rmsnorm_rope_cache``: kv (B, 1, S, rms+rope) splits into ``y = RMSNorm(kv[..., :rms])*gamma``
  and ``k = interleave_rope(kv[..., rms:])``; k goes to k_cache, y to ckv_cache at ``index`` (Norm:
  per-batch offsets (B, S); PA/PA_BNSD/PA_NZ: global slots (B*S,); PA_BLK_*: the first slot of each
  block of block_size tokens; a negative index writes nothing).  v1 writes the caches although its
  schema declares no mutation (as the kernel does) and returns copies; v2 declares the writes
  (``Tensor(a!) k_cache, Tensor(b!) ckv_cache``), v2_functional returns the new caches instead.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._common import _check, _unsupported
from .spec import OpSpec, cores, generated, vector




def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...) on the last dim."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


# ----------------------------------------------------------------------------- apply_rotary_pos_emb
_APPLY = "npu_apply_rotary_pos_emb"
_APPLY_RANK = {"BSND": 4, "SBND": 4, "BNSD": 4, "TND": 3}


def _apply_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_mode: str) -> torch.Tensor:
    """RoPE on the first cos.size(-1) dims of x (the rest passes through), computed in float32."""
    d = cos.size(-1)
    xf = x.float()
    part = xf[..., :d]
    rotated = _rotate_half(part) if rotary_mode == "half" else _rotate_interleaved(part)
    out = part * cos.float() + rotated * sin.float()
    return torch.cat((out, xf[..., d:]), dim=-1).to(x.dtype)


def npu_apply_rotary_pos_emb(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                             layout: str = "BSND", rotary_mode: str = "half"):
    """Rotary embedding of query and key (updated in place); returns (query_out, key_out)."""
    _check(layout in _APPLY_RANK, lambda: f"{_APPLY}: layout only supports BSND, SBND, BNSD and TND, but got {layout}")
    if rotary_mode == "quarter":
        raise _unsupported(_APPLY, "rotary_mode 'quarter'")
    _check(rotary_mode in ("half", "interleave"),
           lambda: f"{_APPLY}: rotary_mode only supports half, quarter and interleave, but got {rotary_mode}")
    rank = _APPLY_RANK[layout]
    for name, t in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        _check(t.dim() == rank, lambda: f"{_APPLY}: {name} must be {rank}-dimensional for layout {layout}, "
                                        f"but got {t.dim()}-dimensional")
    _check(cos.shape == sin.shape, f"{_APPLY}: cos and sin must have the same shape")
    _check(query.size(-1) == key.size(-1), f"{_APPLY}: the last dim (D) of query and key must be equal")
    _check(cos.size(-1) <= query.size(-1) and cos.size(-1) % 2 == 0,
           f"{_APPLY}: the last dim of cos/sin must be even and not larger than the D of query/key")
    q_out, k_out = _apply_one(query, cos, sin, rotary_mode), _apply_one(key, cos, sin, rotary_mode)
    query.copy_(q_out)
    key.copy_(k_out)
    return q_out, k_out


def _apply_meta(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    return torch.empty_like(query), torch.empty_like(key)


# ----------------------------------------------------------------------------- interleave_rope
def npu_interleave_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek interleaved RoPE of a 4-D x (B, N, S, D) with cos/sin broadcasting to it."""
    _check(x.dim() == 4, lambda: f"npu_interleave_rope: x must be 4-dimensional, but got {x.dim()}-dimensional")
    _check(cos.shape == sin.shape and cos.size(-1) == x.size(-1),
           "npu_interleave_rope: cos and sin must have the same shape, with the last dim of x")
    xs = _deinterleave(x.float())
    return (xs * cos.float() + _rotate_half(xs) * sin.float()).to(x.dtype)


# ----------------------------------------------------------------------------- kv_rmsnorm_rope_cache
_KVRC = "npu_kv_rmsnorm_rope_cache"
_CACHE_MODES = ("Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ")


def _check_kvrc(kv, gamma, cos, v) -> None:
    """The wheel's meta-kernel checks (messages verbatim)."""
    if kv.dim() != 4:
        raise RuntimeError("4D tensor expected for input kv")
    if v is not None and v.dim() > 0:
        if v.dtype != kv.dtype:
            raise RuntimeError("v MUST have same data type as kv!")
        if v.dim() != 4:
            raise RuntimeError("4D tensor expected for input v")
        if v.size(0) != kv.size(0) or v.size(1) != kv.size(1) or v.size(2) != kv.size(2):
            raise RuntimeError("v MUST have same token shape as kv!")
    if gamma.dim() != 1:
        raise RuntimeError("1D tensor expected for input gamma")
    if cos.dim() != 4:
        raise RuntimeError("4D tensor expected for input cos")


def _slots(index: torch.Tensor, cache_mode: str, batch: int, seq: int, block_size: int) -> torch.Tensor:
    """Each token's (B*S,) flat cache row (-1: not written)."""
    index = index.to(torch.int64)
    if cache_mode == "Norm":
        return index.reshape(batch, seq)
    if cache_mode in ("PA_BLK_BNSD", "PA_BLK_NZ"):
        blocks = index.reshape(batch, -1)
        s = torch.arange(seq)
        first = blocks[:, s // block_size]
        return torch.where(first < 0, first, first + (s % block_size)).reshape(-1)
    return index.reshape(-1)


def _write(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, cache_mode: str) -> None:
    """Scatter token rows (B, S, D) into ``cache`` (in place) at ``slots``."""
    values = rows.to(cache.dtype)
    if cache_mode == "Norm":                       # cache (B, 1, L, D), slots (B, S) per-batch offsets
        for b in range(values.size(0)):
            keep = slots[b] >= 0
            cache[b, 0, slots[b][keep]] = values[b][keep]
        return
    flat = cache.view(-1, cache.size(-1))          # (block_num * block_size * 1, D)
    tokens = values.reshape(-1, values.size(-1))
    keep = slots >= 0
    flat[slots[keep]] = tokens[keep]


def _kvrc_values(op, kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale, k_rope_offset,
                 c_kv_offset, v, epsilon, cache_mode):
    """(k_embed, y) of the op, and writes them into k_cache / ckv_cache in place."""
    _check_kvrc(kv, gamma, cos, v)
    if v is not None:
        raise _unsupported(op, "the separate v input")
    for name, t in (("k_rope_scale", k_rope_scale), ("c_kv_scale", c_kv_scale), ("k_rope_offset", k_rope_offset),
                    ("c_kv_offset", c_kv_offset)):
        if t is not None:
            raise _unsupported(op, f"quantised caches ({name})")
    _check(cache_mode in _CACHE_MODES, lambda: f"{op}: cache_mode only supports {', '.join(_CACHE_MODES)}, "
                                               f"but got {cache_mode}")
    if k_cache.dim() != 4 or ckv_cache.dim() != 4:
        raise _unsupported(op, "caches not of rank 4 (an NZ storage shape)")
    rms = gamma.size(0)
    rope = cos.size(-1)
    _check(kv.size(-1) == rms + rope, lambda: f"{op}: the last dim of kv ({kv.size(-1)}) must be the gamma size "
                                              f"({rms}) plus the cos size ({rope})")
    x = kv.float()
    rms_in, rope_in = x[..., :rms], x[..., rms:]
    y = rms_in * torch.rsqrt(rms_in.pow(2).mean(dim=-1, keepdim=True) + epsilon) * gamma.float()
    k_embed = npu_interleave_rope(rope_in, cos, sin)
    batch, seq = kv.size(0), kv.size(2)
    block_size = k_cache.size(1)
    slots = _slots(index, cache_mode, batch, seq, block_size)
    tokens_k = k_embed[:, 0]                       # (B, S, rope)
    tokens_y = y[:, 0]
    _write(k_cache, tokens_k, slots, cache_mode)
    _write(ckv_cache, tokens_y, slots, cache_mode)
    return k_embed.to(kv.dtype), y.to(kv.dtype)


def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None, c_kv_scale=None,
                              k_rope_offset=None, c_kv_offset=None, v=None, epsilon: float = 1e-5,
                              cache_mode: str = "Norm", is_output_kv: bool = False):
    """Returns (k_cache, ckv_cache, k_embed_out, y_out); the caches are also updated in place."""
    k_embed, y = _kvrc_values(_KVRC, kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale,
                              k_rope_offset, c_kv_offset, v, epsilon, cache_mode)
    return k_cache.clone(), ckv_cache.clone(), k_embed, y


def _v2_dtypes(op, k_cache_dtype, ckv_cache_dtype) -> None:
    if k_cache_dtype is not None or ckv_cache_dtype is not None:
        raise _unsupported(op, "k_cache_dtype / ckv_cache_dtype (hifloat8/fp8 caches)")


def npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                 c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None,
                                 epsilon: float = 1e-5, cache_mode: str = "Norm", is_output_kv: bool = False,
                                 k_cache_dtype: Optional[int] = None, ckv_cache_dtype: Optional[int] = None):
    """In place on k_cache/ckv_cache (declared); returns (k_embed_out, y_out)."""
    _v2_dtypes("npu_kv_rmsnorm_rope_cache_v2", k_cache_dtype, ckv_cache_dtype)
    return _kvrc_values("npu_kv_rmsnorm_rope_cache_v2", kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale,
                        c_kv_scale, k_rope_offset, c_kv_offset, v, epsilon, cache_mode)


def npu_kv_rmsnorm_rope_cache_v2_functional(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                            c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None,
                                            epsilon: float = 1e-5, cache_mode: str = "Norm",
                                            is_output_kv: bool = False, k_cache_dtype: Optional[int] = None,
                                            ckv_cache_dtype: Optional[int] = None):
    """Out of place: returns (k_embed_out, y_out, new k_cache, new ckv_cache); the inputs are unchanged."""
    _v2_dtypes("npu_kv_rmsnorm_rope_cache_v2_functional", k_cache_dtype, ckv_cache_dtype)
    new_k, new_ckv = k_cache.clone(), ckv_cache.clone()
    k_embed, y = _kvrc_values("npu_kv_rmsnorm_rope_cache_v2_functional", kv, gamma, cos, sin, index, new_k, new_ckv,
                              k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v, epsilon, cache_mode)
    return k_embed, y, new_k, new_ckv


def _kvrc_shapes(kv, gamma, cos, v):
    _check_kvrc(kv, gamma, cos, v)
    lead = list(kv.shape[:-1])
    if v is None:
        return lead + [cos.size(3)], lead + [gamma.size(0)]
    return lead + [kv.size(3)], lead + [v.size(3)]


def _kvrc_meta(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, v=None, **_):
    k_size, c_size = _kvrc_shapes(kv, gamma, cos, v)
    return torch.empty_like(k_cache), torch.empty_like(ckv_cache), kv.new_empty(k_size), kv.new_empty(c_size)


def _kvrc_v2_meta(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, v=None, **_):
    k_size, c_size = _kvrc_shapes(kv, gamma, cos, v)
    return kv.new_empty(k_size), kv.new_empty(c_size)


def _kvrc_v2_functional_meta(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, v=None, **_):
    k_size, c_size = _kvrc_shapes(kv, gamma, cos, v)
    return kv.new_empty(k_size), kv.new_empty(c_size), torch.empty_like(k_cache), torch.empty_like(ckv_cache)


_KVRC_KW = ("*, Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, Tensor? k_rope_offset=None, "
            "Tensor? c_kv_offset=None, Tensor? v=None, float epsilon=1e-5, str cache_mode='Norm', "
            "bool is_output_kv=False")


# ------------------------------------------------------------------------------- npu_mrope
def npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
              cache_mode="default"):
    """vLLM's (multimodal) rotary embedding from a cos/sin cache (aclnnRopeWithSinCosCache): each token's
    ``cos_sin_cache[position]`` is ``cos`` then ``sin`` (``rotary_dim // 2`` each); 2-D ``positions``
    ``[m, num_tokens]`` take frequency section ``i`` of ``mrope_section`` from row ``i`` (m = 3 or 4).
    The first ``rotary_dim`` of each head rotate ("half": NeoX halves, "interleave": GPT-J pairs), the
    rest pass through."""
    op = "npu_mrope"
    _check(rotary_mode in ("half", "interleave"), lambda: "rotary_mode only support half or interleave")
    _check(cache_mode in ("default", "interleave"), lambda: "cache_mode only support default or interleave")
    _check(positions.dim() in (1, 2), lambda: f"{op}: positions must be [num_tokens] or [m, num_tokens], but got "
                                              f"{list(positions.shape)}")
    _check(positions.dtype in (torch.int32, torch.int64),
           lambda: f"{op}: positions must be int32 or int64, but got {positions.dtype}")
    rotary_dim = cos_sin_cache.size(-1)
    half = rotary_dim // 2
    _check(rotary_dim % 2 == 0 and rotary_dim <= head_size,
           lambda: f"{op}: cos_sin_cache's last dim ({rotary_dim}) must be even and at most head_size ({head_size})")
    tokens = positions.size(-1)
    for name, x in (("query", query), ("key", key)):
        _check(x.size(0) == tokens and x.size(-1) % head_size == 0,
               lambda: f"{op}: {name} must be [num_tokens={tokens}, num_heads * head_size={head_size}], but got "
                       f"{list(x.shape)}")
    cos, sin = cos_sin_cache.index_select(0, positions.reshape(-1).long()).float().chunk(2, dim=-1)
    if positions.dim() == 2:
        rows = positions.size(0)
        _check(mrope_section is not None and len(mrope_section) == rows and rows in (3, 4)
               and sum(mrope_section) == half,
               lambda: f"{op}: 2-D positions need mrope_section with one entry per row (3 or 4) summing to "
                       f"rotary_dim // 2 = {half}, but got {mrope_section}")
        _check(cache_mode == "default", lambda: f"{op}: cache_mode='interleave' is not emulated")
        cos, sin = (torch.cat([t.reshape(rows, tokens, half)[i, :, sum(mrope_section[:i]):sum(mrope_section[:i + 1])]
                               for i in range(rows)], dim=-1) for t in (cos, sin))
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x):
        heads = x.reshape(tokens, -1, head_size).float()
        rot, rest = heads[..., :rotary_dim], heads[..., rotary_dim:]
        if rotary_mode == "half":
            x1, x2 = rot[..., :half], rot[..., half:]
            rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((rot, rest), dim=-1).reshape(x.shape).to(x.dtype)

    return rotate(query), rotate(key)

# ------------------------------------------------------------------------------- _npu_rotary_embedding
def _npu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style):
    """ATB's rotary embedding (vLLM's ``rotary_embedding`` kernel), in place on ``query`` [T, Nq * head_size]
    and ``key`` [T, Nk * head_size]: token ``t`` takes ``cos, sin = cos_sin_cache[positions[t]].chunk(2)``
    (``rotary_dim // 2`` each, rotary_dim = cos_sin_cache.size(-1)); the first rotary_dim values of each
    head rotate (NeoX halves if ``is_neox_style``, else GPT-J pairs), the rest are left as they are."""
    op = "_npu_rotary_embedding"
    _check(positions.dtype in (torch.int32, torch.int64),
           lambda: f"{op}: positions must be int32 or int64, but got {positions.dtype}")
    _check(cos_sin_cache.dim() == 2, lambda: f"{op}: cos_sin_cache must be [max_position, rotary_dim], but got "
                                             f"{list(cos_sin_cache.shape)}")
    tokens = positions.numel()
    rotary_dim = cos_sin_cache.size(-1)
    _check(rotary_dim % 2 == 0 and 0 < rotary_dim <= head_size,
           lambda: f"{op}: cos_sin_cache's last dim ({rotary_dim}) must be even and at most head_size ({head_size})")
    for name, x in (("query", query), ("key", key)):
        _check(x.size(0) == tokens and x.numel() % (tokens * head_size) == 0,
               lambda: f"{op}: {name} must be [num_tokens={tokens}, num_heads * head_size={head_size}], but got "
                       f"{list(x.shape)}")
    if tokens == 0:
        return
    _check(int(positions.min()) >= 0 and int(positions.max()) < cos_sin_cache.size(0),
           lambda: f"{op}: positions must lie in [0, {cos_sin_cache.size(0)})")
    rows = cos_sin_cache.index_select(0, positions.reshape(-1).long()).float()
    cos, sin = rows[:, None, :rotary_dim // 2], rows[:, None, rotary_dim // 2:]
    for x in (query, key):
        heads = x.reshape(tokens, -1, head_size).float()
        rot = heads[..., :rotary_dim]
        if is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
            rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        x.copy_(torch.cat((rot, heads[..., rotary_dim:]), dim=-1).reshape(x.shape).to(x.dtype))


SPECS = [
    OpSpec(generated("_npu_rotary_embedding"), _npu_rotary_embedding, cores("ATB", vector="all"), namespace="atb",
           meta=lambda *args: None),
    OpSpec("npu_apply_rotary_pos_emb(Tensor query, Tensor key, Tensor cos, Tensor sin, str layout='BSND', "
           "str rotary_mode='half') -> (Tensor, Tensor)", npu_apply_rotary_pos_emb, vector(), meta=_apply_meta),
    OpSpec(generated("npu_mrope"), npu_mrope, vector(),
           meta=lambda positions, query, key, cos_sin_cache, head_size, **kw: (torch.empty_like(query),
                                                                                 torch.empty_like(key))),
    OpSpec("npu_interleave_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor", npu_interleave_rope, vector(),
           meta=lambda x, cos, sin: torch.empty_like(x)),
    OpSpec("npu_kv_rmsnorm_rope_cache(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, Tensor k_cache, "
           f"Tensor ckv_cache, {_KVRC_KW}) -> (Tensor, Tensor, Tensor, Tensor)",
           npu_kv_rmsnorm_rope_cache, vector(), meta=_kvrc_meta),
    OpSpec("npu_kv_rmsnorm_rope_cache_v2(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, "
           f"Tensor(a!) k_cache, Tensor(b!) ckv_cache, {_KVRC_KW}, int? k_cache_dtype=None, "
           "int? ckv_cache_dtype=None) -> (Tensor, Tensor)", npu_kv_rmsnorm_rope_cache_v2, vector(),
           meta=_kvrc_v2_meta),
    # TorchAir's reinplace pass turns the functional form back into v2, writing arguments 5 and 6.
    OpSpec("npu_kv_rmsnorm_rope_cache_v2_functional(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, "
           f"Tensor k_cache, Tensor ckv_cache, {_KVRC_KW}, int? k_cache_dtype=None, int? ckv_cache_dtype=None) "
           "-> (Tensor, Tensor, Tensor, Tensor)", npu_kv_rmsnorm_rope_cache_v2_functional, vector(),
           meta=_kvrc_v2_functional_meta, reinplace=("npu_kv_rmsnorm_rope_cache_v2", (5, 6))),
]
