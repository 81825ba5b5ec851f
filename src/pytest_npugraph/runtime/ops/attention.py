"""Inference attention, npu_attention_update and npu_rotary_mul.

npu_fused_infer_attention_score (v1; v2 is v1's math under v2's argument names plus learnable_sink),
its ``.out`` overloads that write caller-owned buffers (vLLM-Ascend's graph-capture path, with
``_npu_fused_infer_attention_score*_get_max_workspace`` / ``*_infer_output`` for the buffers), and the
older prefill/decode entry points npu_prompt_flash_attention and npu_incre_flash_attention, both the
same math.  FIA v1/v2 and their ``.out`` are graph-updatable under ``torch.npu.graph`` auto-dispatch.
npu_attention_update merges the partial outputs of attention over disjoint KV parts (vLLM-Ascend's
context-parallel and chunked-prefill paths) through their log-sum-exps.
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch
import torch.nn.functional as F

from ._common import _check, _f32, _quant_round, _unsupported
from .spec import OpSpec, cores, generated, mix, vector


def npu_rotary_mul(self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half",
                   rotate: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rotary embedding ``r1*x + r2*x_new`` (r1 = cos, r2 = sin), x_new by mode or ``x @ rotate``."""
    if rotary_mode not in ("half", "interleave"):
        raise RuntimeError(f"npu_rotary_mul: rotary_mode only supports 'half' and 'interleave', but got {rotary_mode!r}")
    if self.dim() != 4:
        raise RuntimeError(f"npu_rotary_mul: input must be 4-D (BNSD, BSND or SBND), but got {self.dim()}-D")
    x = self.to(torch.float32)
    if rotate is not None:
        x_new = x @ rotate.to(torch.float32)
    elif rotary_mode == "half":
        first, second = x.chunk(2, dim=-1)
        x_new = torch.cat((-second, first), dim=-1)
    else:
        x_new = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return (r1.to(torch.float32) * x + r2.to(torch.float32) * x_new).to(self.dtype)


def _sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    """``t`` summed over the dimensions a broadcast of ``shape`` expanded."""
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead > 0 else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.size(i) != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def npu_rotary_mul_backward(grad: torch.Tensor, self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                            rotary_mode: str = "half"):
    """Gradients of ``y = r1*x + r2*rotate(x)`` for x, r1 and r2 (r1/r2 summed back to their
    broadcast shapes): ``dx = r1*g + rotate^T(r2*g)``, ``dr1 = g*x``, ``dr2 = g*rotate(x)``."""
    if rotary_mode not in ("half", "interleave"):
        raise RuntimeError(f"npu_rotary_mul_backward: rotary_mode only supports 'half' and 'interleave', but got "
                           f"{rotary_mode!r}")
    g, x = grad.to(torch.float32), self.to(torch.float32)
    v = r2.to(torch.float32) * g
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        v1, v2 = v.chunk(2, dim=-1)
        rotated, back = torch.cat((-x2, x1), dim=-1), torch.cat((v2, -v1), dim=-1)
    else:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
        back = torch.stack((v[..., 1::2], -v[..., 0::2]), dim=-1).flatten(-2)
    dx = r1.to(torch.float32) * g + back
    return (dx.to(self.dtype), _sum_to(g * x, r1.shape).to(r1.dtype), _sum_to(g * rotated, r2.shape).to(r2.dtype))


def _rotary_mul_setup(ctx, inputs, output):
    self, r1, r2, rotary_mode, rotate = inputs
    ctx.save_for_backward(self, r1, r2)
    ctx.rotary_mode, ctx.custom_rotate = rotary_mode, rotate is not None


def _rotary_mul_grad(ctx, grad):
    _check(not ctx.custom_rotate, lambda: "npu_rotary_mul: the backward of a custom rotate matrix is not emulated")
    self, r1, r2 = ctx.saved_tensors
    dx, dr1, dr2 = torch.ops.npu.npu_rotary_mul_backward(grad, self, r1, r2, ctx.rotary_mode)
    return dx, dr1, dr2, None, None


# ----------------------------------------------------------------------------- attention_update
_ATTENTION_UPDATE_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def npu_attention_update(lse, local_out, update_type: int):
    """AttentionUpdate (torch_npu doc, CANN aclnnAttentionUpdate): ``sp`` partial results, each ``lse_i``
    ``[N]`` (float32) with ``O_i`` ``[N, head_dim]``, become the global result::

        lse_max = max_i lse_i;  lse_m = lse_max + log(sum_i exp(lse_i - lse_max))
        O = sum_i O_i * exp(lse_i - lse_m)

    Returns ``(O, lse_m)``; O has ``local_out[0]``'s dtype, computed in float32.  ``update_type`` 0 does not
    produce ``lse_m``: torch_npu allocates it only for ``update_type == 1`` and returns an undefined tensor
    (``None`` in Python) otherwise; the meta kernel still gives it ``lse[0]``'s shape.
    """
    op = "npu_attention_update"
    sp = len(lse)
    _check(update_type in (0, 1), lambda: f"{op}: update_type must be 0 (no lse_out) or 1 (lse_out), but got "
                                          f"{update_type}")
    _check(1 <= sp <= 16, lambda: f"{op}: the sequence-parallel degree sp = len(lse) must be in [1, 16], but got {sp}")
    _check(len(local_out) == sp, lambda: f"{op}: lse and local_out must have the same length (sp), but got {sp} and "
                                         f"{len(local_out)}")
    ref, ref_lse = local_out[0], lse[0]
    _check(ref.dim() == 2, lambda: f"{op}: local_out tensors must be 2-D [batch * seqLen * headNum, head_dim], but "
                                   f"got {list(ref.shape)}")
    rows, head_dim = ref.shape
    _check(8 <= head_dim <= 512 and head_dim % 8 == 0,
           lambda: f"{op}: head_dim must be a multiple of 8 in [8, 512], but got {head_dim}")
    _check(ref.dtype in _ATTENTION_UPDATE_OUT_DTYPES,
           lambda: f"{op}: local_out dtype must be float32, float16 or bfloat16, but got {ref.dtype}")
    for i in range(sp):
        _check(lse[i].dtype == torch.float32, lambda: f"{op}: lse[{i}] must be float32, but got {lse[i].dtype}")
        _check(tuple(lse[i].shape) == (rows,), lambda: f"{op}: lse[{i}] must have shape [{rows}] "
                                                       f"(batch * seqLen * headNum), but got {list(lse[i].shape)}")
        _check(tuple(local_out[i].shape) == (rows, head_dim) and local_out[i].dtype == ref.dtype,
               lambda: f"{op}: local_out[{i}] must be {ref.dtype} {[rows, head_dim]} like local_out[0], but got "
                       f"{local_out[i].dtype} {list(local_out[i].shape)}")
    stacked = torch.stack([t.to(torch.float32) for t in lse])                # [sp, N]
    lse_max = stacked.max(dim=0).values
    lse_m = lse_max + torch.log(torch.exp(stacked - lse_max).sum(dim=0))
    weights = torch.exp(stacked - lse_m)                                     # [sp, N]
    out = sum(w.unsqueeze(-1) * o.to(torch.float32) for w, o in zip(weights, local_out))
    return out.to(ref.dtype), (lse_m if update_type == 1 else None)


def _attention_update_meta(lse, local_out, update_type):
    return torch.empty_like(local_out[0]), torch.empty_like(lse[0])


# ----------------------------------------------------------------------------- attention
# input_layout -> (query/key layout, attention_out layout, query rank); facts of torch_npu's meta kernel.
_FIA_LAYOUTS = {
    "BSH": ("BSH", "BSH", 3), "BSND": ("BSND", "BSND", 4), "BNSD": ("BNSD", "BNSD", 4),
    "TND": ("TND", "TND", 3), "NTD": ("NTD", "NTD", 3), "BNSD_BSND": ("BNSD", "BSND", 4),
    "BSH_BNSD": ("BSH", "BNSD", 3), "BSND_BNSD": ("BSND", "BNSD", 4), "NTD_TND": ("NTD", "TND", 3),
    "BSH_NBSD": ("BSH", "NBSD", 3), "BSND_NBSD": ("BSND", "NBSD", 4), "BNSD_NBSD": ("BNSD", "NBSD", 4),
    "TND_NTD": ("TND", "NTD", 3), "NSD": ("NSD", "NSD", 3),
}
_FIA = "npu_fused_infer_attention_score"
_COMPRESSED_MASK = 2048


def _bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    """A batch-major tensor in ``layout`` as (B, N, S, D)."""
    if layout == "BSH":
        return t.reshape(t.size(0), t.size(1), heads, t.size(2) // heads).transpose(1, 2)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t.unsqueeze(0) if layout == "NSD" else t


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2)
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "NBSD":
        return t.transpose(0, 1)
    return t[0] if layout == "NSD" else t


def _lengths(values, batch: int, full: int, what: str):
    """Per-batch valid lengths: None -> full, one value -> broadcast, else the first ``batch``."""
    if values is None:
        return [full] * batch
    values = [int(v) for v in values]
    if len(values) == 1:
        return values * batch
    _check(len(values) >= batch, lambda: f"{_FIA}: {what} has {len(values)} entries for batch {batch}")
    return values[:batch]


def _segments(t: torch.Tensor, layout: str, cumulative, what: str):
    """A token-major (TND/NTD) tensor split into per-batch (N, S_b, D) pieces by cumulative lengths."""
    _check(cumulative is not None, lambda: f"{_FIA}: {what} must be given for layout {layout}")
    tnd = t if layout == "TND" else t.transpose(0, 1)
    ends = [int(v) for v in cumulative]
    return [tnd[lo:hi].transpose(0, 1) for lo, hi in zip([0] + ends[:-1], ends)]


def _paged(cache: torch.Tensor, block_table: torch.Tensor, lengths, kv_heads: int):
    """Gather each batch's KV from a paged cache (blocks, block_size, H) or (blocks, N, block_size, D)."""
    pieces = []
    for b, length in enumerate(lengths):
        block_size = cache.size(1) if cache.dim() == 3 else cache.size(2)
        blocks = block_table[b, :(length + block_size - 1) // block_size].to(torch.int64)
        if cache.dim() == 3:
            seq = cache[blocks].reshape(-1, kv_heads, cache.size(2) // kv_heads).transpose(0, 1)
        else:
            seq = cache[blocks].transpose(0, 1).flatten(1, 2)
        pieces.append(seq[:, :length])
    return pieces


def _user_mask(atten_mask: torch.Tensor, b: int, s_q: int, s_kv: int, batch: int) -> torch.Tensor:
    """Batch b's slice of a full atten_mask as bool (1 or N, s_q, s_kv); True = masked out."""
    m = atten_mask.to(torch.bool)
    if m.dim() == 2:
        m = m[b].reshape(1, 1, -1) if (s_q == 1 and m.size(0) == batch) else m.unsqueeze(0)
    elif m.dim() == 3:
        m = m[b if m.size(0) > 1 else 0].unsqueeze(0)
    else:
        m = m[b if m.size(0) > 1 else 0]
    return m[..., :s_q, :s_kv]


def _band(s_q: int, s_kv: int, shift: int, pre: int, nxt: int) -> torch.Tensor:
    """True where key j is outside ``[i + shift - pre, i + shift + nxt]`` for query row i."""
    rel = torch.arange(s_kv).unsqueeze(0) - torch.arange(s_q).unsqueeze(1) - shift
    return (rel > nxt) | (rel < -pre)


def _attention_mask(sparse_mode, atten_mask, b, s_q, s_kv, batch, pre_tokens, next_tokens, incremental):
    """The boolean mask of one batch for sparse modes 0-4 (None = nothing masked)."""
    if incremental or sparse_mode in (0, 1):
        if atten_mask is None:
            return None
        mask = _user_mask(atten_mask, b, s_q, s_kv, batch)
        if sparse_mode == 0 and not incremental:
            mask = mask | _band(s_q, s_kv, 0, pre_tokens, next_tokens)
        return mask
    _check(atten_mask is not None and tuple(atten_mask.shape[-2:]) == (_COMPRESSED_MASK, _COMPRESSED_MASK),
           lambda: f"{_FIA}: sparse_mode {sparse_mode} needs the compressed causal atten_mask of shape "
                   f"(2048, 2048), (1, 2048, 2048) or (1, 1, 2048, 2048)")
    if sparse_mode == 2:
        return _band(s_q, s_kv, 0, s_kv, 0)
    if sparse_mode == 3:
        return _band(s_q, s_kv, s_kv - s_q, s_kv + s_q, 0)
    return _band(s_q, s_kv, s_kv - s_q, pre_tokens, next_tokens)


def _attend(q, k, v, scale, mask, pse):
    """Softmax attention of one batch: q (N, Sq, D), k/v (N, Skv, D) already head-matched."""
    scores = scale * (q @ k.transpose(-1, -2))
    if pse is not None:
        scores = scores + pse
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    dead = torch.isneginf(lse)
    probs = torch.exp(scores - torch.where(dead, torch.zeros_like(lse), lse).unsqueeze(-1))
    out = torch.where(dead.unsqueeze(-1), 0.0, probs @ v)
    return out, torch.where(dead, torch.full_like(lse, float("inf")), lse)


_FIA_UNMODELLED = ("dequant_scale1", "quant_scale1", "dequant_scale2", "antiquant_scale", "antiquant_offset",
                   "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset",
                   "query_padding_size", "kv_padding_size", "key_shared_prefix", "value_shared_prefix",
                   "actual_shared_prefix_len", "key_rope_antiquant_scale")


def npu_fused_infer_attention_score(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, pse_shift=None, atten_mask=None,
        actual_seq_lengths=None, actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None,
        dequant_scale2=None, quant_scale2=None, quant_offset2=None, antiquant_scale=None, antiquant_offset=None,
        key_antiquant_scale=None, key_antiquant_offset=None, value_antiquant_scale=None,
        value_antiquant_offset=None, block_table=None, query_padding_size=None, kv_padding_size=None,
        key_shared_prefix=None, value_shared_prefix=None, actual_shared_prefix_len=None, query_rope=None,
        key_rope=None, key_rope_antiquant_scale=None, num_heads: int = 1, scale: float = 1.0,
        pre_tokens: int = 2147483647, next_tokens: int = 2147483647, input_layout: str = "BSH",
        num_key_value_heads: int = 0, sparse_mode: int = 0, inner_precise: int = 0, block_size: int = 0,
        antiquant_mode: int = 0, key_antiquant_mode: int = 0, value_antiquant_mode: int = 0,
        softmax_lse_flag: bool = False):
    """Inference attention ``softmax(scale*QK^T + pse, masked) V`` for all torch_npu layouts.

    GQA: query head h reads KV head ``h // (num_heads / num_key_value_heads)``.  atten_mask is
    bool/int8/uint8 with nonzero = masked.  sparse_mode 0 (full mask or none, plus the pre/next
    token band when a mask is given), 1 (full mask), 2 (left-up causal), 3 (right-down causal),
    4 (right-down band); with a one-token query (no rope) sparse_mode and the band are ignored.
    actual_seq_lengths(_kv) are per-batch lengths, cumulative for TND/NTD; rows past them are 0.
    MLA rope parts are concatenated to Q/K; a block_table reads KV from a paged cache.  Rows with
    every key masked give output 0 and softmax_lse +inf; without softmax_lse_flag the lse is the
    meta kernel's empty [0] tensor.  quant_scale2/quant_offset2 requantise the output to int8.
    """
    _check(num_heads > 0, lambda: "numHeads should be greater than 0, but got " + str(num_heads))
    _check(input_layout in _FIA_LAYOUTS, lambda: f"Layout {input_layout} is not supported!")
    q_layout, out_layout, q_rank = _FIA_LAYOUTS[input_layout]
    _check(query.dim() == q_rank, lambda: f"Layout {q_layout}, queryDims({query.dim()}) must be {q_rank}!")
    args = locals()
    given = [name for name in _FIA_UNMODELLED if args[name] is not None]
    if given:
        raise _unsupported(_FIA, ", ".join(given))
    if query.dtype == torch.int8 or key.dtype in (torch.int8, torch.int32):
        raise _unsupported(_FIA, "int8/int4 query, key or value")
    _check(sparse_mode in (0, 1, 2, 3, 4),
           lambda: f"{_FIA}: sparse_mode {sparse_mode} is not supported, expected 0, 1, 2, 3 or 4")
    _check((query_rope is None) == (key_rope is None), f"{_FIA}: query_rope and key_rope must be given together")
    kv_heads = num_key_value_heads or num_heads
    token_major = q_layout in ("TND", "NTD")

    def per_batch_q(t):
        if token_major:
            return _segments(t, q_layout, actual_seq_lengths, "actual_seq_lengths")
        return list(_bnsd(t, q_layout, num_heads))

    def per_batch_kv(t):
        if block_table is not None:
            _check(actual_seq_lengths_kv is not None, f"{_FIA}: a block_table needs actual_seq_lengths_kv")
            return _paged(t, block_table, _lengths(actual_seq_lengths_kv, len(qs), 0, "actual_seq_lengths_kv"),
                          kv_heads)
        if token_major:
            return _segments(t, q_layout, actual_seq_lengths_kv, "actual_seq_lengths_kv")
        t4 = _bnsd(t, q_layout, kv_heads)
        lengths = _lengths(actual_seq_lengths_kv, len(qs), t4.size(2), "actual_seq_lengths_kv")
        return [t4[b, :, :n] for b, n in enumerate(lengths)]

    qs = _with_rope(per_batch_q(query), None if query_rope is None else per_batch_q(query_rope))
    ks = _with_rope(per_batch_kv(key), None if key_rope is None else per_batch_kv(key_rope))
    vs = _with_rope(per_batch_kv(value), None)
    full_q = [q.size(1) for q in qs]
    incremental = max(full_q) == 1 and query_rope is None
    q_lens = full_q if token_major or incremental else _lengths(actual_seq_lengths, len(qs), full_q[0],
                                                                 "actual_seq_lengths")
    heads = qs[0].size(0)
    _check(heads % ks[0].size(0) == 0, lambda: f"{_FIA}: num_heads {heads} must be a multiple of "
                                               f"num_key_value_heads {ks[0].size(0)}")
    group = heads // ks[0].size(0)
    outs, lses = [], []
    for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
        s_q, s_kv = q_lens[b], k.size(1)
        mask = _attention_mask(sparse_mode, atten_mask, b, s_q, s_kv, len(qs), pre_tokens, next_tokens, incremental)
        pse = None if pse_shift is None else _f32(pse_shift[b if pse_shift.size(0) > 1 else 0])[:, :s_q, :s_kv]
        out, lse = _attend(q[:, :s_q], k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0),
                           scale, mask, pse)
        out = out.to(query.dtype) if quant_scale2 is None else _requantise(out, quant_scale2, quant_offset2)
        outs.append(F.pad(out, (0, 0, 0, full_q[b] - s_q)))
        lses.append(F.pad(lse, (0, full_q[b] - s_q)))
    if token_major:
        pad = query.size(0 if q_layout == "TND" else 1) - sum(full_q)
        out_t = F.pad(torch.cat(outs, dim=1), (0, 0, 0, pad))
        attention = out_t.transpose(0, 1) if out_layout == "TND" else out_t
        lse_out = F.pad(torch.cat(lses, dim=1), (0, pad)).transpose(0, 1).unsqueeze(-1)
    else:
        attention = _from_bnsd(torch.stack(outs), out_layout)
        lse_out = torch.stack(lses).unsqueeze(-1)
    if not softmax_lse_flag:
        lse_out = torch.empty(0, dtype=torch.float32)
    return attention, lse_out


def _with_rope(main, rope):
    """Per-batch float32 pieces, with the MLA rope pieces appended on the last dim when given."""
    if rope is None:
        return [_f32(m) for m in main]
    return [torch.cat((_f32(m), _f32(r)), dim=-1) for m, r in zip(main, rope)]


def _requantise(out: torch.Tensor, quant_scale2: torch.Tensor, quant_offset2: Optional[torch.Tensor]):
    """int8 output quantisation of one batch (N, S, D): per-tensor, or per-channel over N*D (= H)."""
    def shaped(t):
        t = t.to(torch.float32)
        return t.reshape(()) if t.numel() == 1 else t.reshape(out.size(0), 1, -1)
    y = out * shaped(quant_scale2)
    if quant_offset2 is not None:
        y = y + shaped(quant_offset2)
    return _quant_round(y, 127.0)


# ----------------------------------------------------------------------------- FIA shapes, .out, v2, PFA, IFA
def _value_d(block_table, value, query, q_layout: str, kv_heads: int) -> int:
    """The value head dim (torch_npu's meta rule; int32 values are 8 packed int4)."""
    if block_table is not None:
        _check(value.dim() in (3, 4, 5), lambda: "when Page Attention enabled, value's dim should be 3/4/5, but got "
                                                 + str(value.dim()))
        d = {3: lambda: value.size(2) // kv_heads, 4: lambda: value.size(3),
             5: lambda: value.size(2) * value.size(4)}[value.dim()]()
    else:
        _check(value.dim() == query.dim(), lambda: f"when Page Attention not enabled, value'dim{value.dim()} should "
                                                   f"equal to query's dim{query.dim()}!")
        d = value.size(2) // kv_heads if q_layout == "BSH" else value.size(3 if q_layout in ("BNSD", "BSND") else 2)
    return d * (8 if value.dtype == torch.int32 else 1)


def _fia_output_shapes(query, value, input_layout: str, num_heads: int, num_key_value_heads: int, block_table,
                       softmax_lse_flag: bool):
    """(attention_out shape, softmax_lse shape) of a fused-infer-attention call."""
    _check(num_heads > 0, lambda: "numHeads should be greater than 0, but got " + str(num_heads))
    _check(input_layout in _FIA_LAYOUTS, lambda: f"Layout {input_layout} is not supported!")
    q_layout, out_layout, q_rank = _FIA_LAYOUTS[input_layout]
    _check(query.dim() == q_rank, lambda: f"Layout {q_layout}, queryDims({query.dim()}) must be {q_rank}!")
    value_d = _value_d(block_table, value, query, q_layout, num_key_value_heads or num_heads)
    if q_layout in ("TND", "NTD"):
        t, n, d = (query.size(0), query.size(1), query.size(2)) if q_layout == "TND" else \
            (query.size(1), query.size(0), query.size(2))
        out_d = d if value_d == 0 or d == 0 else value_d
        out = [t, n, out_d] if out_layout == "TND" else [n, t, out_d]
        lse = [t, n, 1]
    else:
        if q_layout == "BSH":
            b, s, n, d = query.size(0), query.size(1), num_heads, query.size(2) // num_heads
        elif q_layout == "BSND":
            b, s, n, d = query.shape
        elif q_layout == "BNSD":
            b, n, s, d = query.shape
        else:                                                        # NSD
            b, n, s, d = 1, query.size(0), query.size(1), query.size(2)
        out_d = d if value_d == 0 or d == 0 else value_d
        out = {"BSH": [b, s, n * value_d if value_d and query.size(2) else query.size(2)], "BSND": [b, s, n, out_d],
               "BNSD": [b, n, s, out_d], "NBSD": [n, b, s, out_d], "NSD": [n, s, out_d]}[out_layout]
        lse = [b, n, s, 1]
    return out, (lse if softmax_lse_flag else [0])


def _fia_out_dtype(query, quant_scale2, query_rope):
    if quant_scale2 is not None:
        return torch.int8
    if query.dtype == torch.int8:
        return torch.float16 if query_rope is None else query_rope.dtype
    return query.dtype


def _fia_meta(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None, block_table=None,
              quant_scale2=None, query_rope=None, num_heads=1, input_layout="BSH", num_key_value_heads=0,
              softmax_lse_flag=False, **_):
    out, lse = _fia_output_shapes(query, value, input_layout, num_heads, num_key_value_heads, block_table,
                                  softmax_lse_flag)
    return (query.new_empty(out, dtype=_fia_out_dtype(query, quant_scale2, query_rope)),
            query.new_empty(lse, dtype=torch.float32))


def _npu_fused_infer_attention_score_infer_output(query, value, *, input_layout="BSH", quant_scale2=None,
                                                  block_table=None, num_heads=1, num_key_value_heads=0,
                                                  softmax_lse_flag=False, query_rope=None):
    """Output buffers (zero-filled) shaped as the op returns them (torch.npu.graph's capture pre-allocation)."""
    out, lse = _fia_output_shapes(query, value, input_layout, num_heads, num_key_value_heads, block_table,
                                  softmax_lse_flag)
    return (torch.zeros(out, dtype=_fia_out_dtype(query, quant_scale2, query_rope)),
            torch.zeros(lse, dtype=torch.float32))


_WORKSPACE_BYTES = 64   # the CPU math needs none; a small buffer stands for the kernel's scratch memory


def _workspace(*args, **kwargs) -> torch.Tensor:
    """``_get_max_workspace``: the scratch buffer handed to ``.out`` (its real size is hardware-specific)."""
    return torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8)


def _write_out(result, attention_out, softmax_lse, lse_wanted: bool):
    """Copy a (attention, lse) result into caller-owned buffers, as the ``.out`` kernels write them."""
    attention, lse = result
    _check(attention_out.shape == attention.shape,
           lambda: f"attention_out has shape {list(attention_out.shape)}, expected {list(attention.shape)}")
    attention_out.copy_(attention)
    if lse_wanted:
        _check(softmax_lse.shape == lse.shape,
               lambda: f"softmax_lse has shape {list(softmax_lse.shape)}, expected {list(lse.shape)}")
        softmax_lse.copy_(lse)
    return attention_out, softmax_lse


def npu_fused_infer_attention_score_out(query, key, value, *, workspace=None, attention_out, softmax_lse, **kwargs):
    """``npu_fused_infer_attention_score.out``: the result written into attention_out (and softmax_lse with
    softmax_lse_flag); the workspace is only scratch memory."""
    result = npu_fused_infer_attention_score(query, key, value, **kwargs)
    return _write_out(result, attention_out, softmax_lse, kwargs.get("softmax_lse_flag", False))


_FIA_V2 = "npu_fused_infer_attention_score_v2"
_V2_UNMODELLED = ("dequant_scale_query", "dequant_scale_key", "dequant_offset_key", "dequant_scale_value",
                  "dequant_offset_value", "dequant_scale_key_rope", "quant_scale_p", "query_dtype", "key_dtype",
                  "value_dtype", "query_rope_dtype", "key_rope_dtype", "key_shared_prefix_dtype",
                  "value_shared_prefix_dtype", "dequant_scale_query_dtype", "dequant_scale_key_dtype",
                  "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype", "out_dtype")


def npu_fused_infer_attention_score_v2(
        query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None, actual_seq_qlen=None,
        actual_seq_kvlen=None, block_table=None, dequant_scale_query=None, dequant_scale_key=None,
        dequant_offset_key=None, dequant_scale_value=None, dequant_offset_value=None, dequant_scale_key_rope=None,
        quant_scale_out=None, quant_offset_out=None, quant_scale_p=None, learnable_sink=None, num_query_heads=1,
        num_key_value_heads=0, softmax_scale=1.0, pre_tokens=2147483647, next_tokens=2147483647, input_layout="BSH",
        sparse_mode=0, block_size=0, query_quant_mode=0, key_quant_mode=0, value_quant_mode=0, inner_precise=0,
        return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None, query_rope_dtype=None,
        key_rope_dtype=None, key_shared_prefix_dtype=None, value_shared_prefix_dtype=None,
        dequant_scale_query_dtype=None, dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
        dequant_scale_key_rope_dtype=None, out_dtype=None):
    """v2 of fused infer attention: v1's math under v2's argument names, plus ``learnable_sink``.

    learnable_sink (one logit per query head) joins every row's softmax and takes its share of the
    probability mass: ``out = out_v1 * sigmoid(lse - sink[h])`` and ``lse = logaddexp(lse, sink[h])``.
    """
    _check(num_query_heads > 0, lambda: "numHeads should be greater than 0, but got " + str(num_query_heads))
    args = locals()
    given = [name for name in _V2_UNMODELLED if args[name] is not None]
    if given or query_quant_mode or key_quant_mode or value_quant_mode:
        raise _unsupported(_FIA_V2, ", ".join(given) or "quant modes")
    attention, lse = npu_fused_infer_attention_score(
        query, key, value, pse_shift=pse_shift, atten_mask=atten_mask, actual_seq_lengths=actual_seq_qlen,
        actual_seq_lengths_kv=actual_seq_kvlen, quant_scale2=None if learnable_sink is not None else quant_scale_out,
        quant_offset2=None if learnable_sink is not None else quant_offset_out, block_table=block_table,
        query_rope=query_rope, key_rope=key_rope, num_heads=num_query_heads, scale=softmax_scale,
        pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
        num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode, inner_precise=inner_precise,
        block_size=block_size, softmax_lse_flag=return_softmax_lse or learnable_sink is not None)
    if learnable_sink is None:
        return attention, lse
    _check(input_layout in ("TND", "NTD_TND"), f"{_FIA_V2}: learnable_sink only supports the TND and NTD_TND layouts")
    sink = learnable_sink.float().reshape(1, -1, 1)                   # (1, N, 1) against lse (T, N, 1)
    alive = torch.isfinite(lse)
    keep = torch.where(alive, torch.sigmoid(lse - sink), torch.zeros_like(lse))
    scaled = attention.float() * keep                                 # TND rows: (T, N, D) * (T, N, 1)
    if quant_scale_out is not None:
        result = _requantise(scaled.transpose(0, 1), quant_scale_out, quant_offset_out).transpose(0, 1)
    else:
        result = scaled.to(attention.dtype)
    new_lse = torch.where(alive, torch.logaddexp(lse, sink), lse)
    if not return_softmax_lse:
        new_lse = torch.empty(0, dtype=torch.float32)
    return result, new_lse


def _fia_v2_meta(query, key, value, *, block_table=None, quant_scale_out=None, query_rope=None, num_query_heads=1,
                 input_layout="BSH", num_key_value_heads=0, return_softmax_lse=False, **_):
    out, lse = _fia_output_shapes(query, value, input_layout, num_query_heads, num_key_value_heads, block_table,
                                  return_softmax_lse)
    return (query.new_empty(out, dtype=_fia_out_dtype(query, quant_scale_out, query_rope)),
            query.new_empty(lse, dtype=torch.float32))


def _npu_fused_infer_attention_score_v2_infer_output(query, value, *, query_dtype=None, value_dtype=None,
                                                     input_layout="BSH", quant_scale_out=None, block_table=None,
                                                     num_query_heads=1, num_key_value_heads=0,
                                                     return_softmax_lse=False, query_rope=None, out_dtype=None):
    out, lse = _fia_output_shapes(query, value, input_layout, num_query_heads, num_key_value_heads, block_table,
                                  return_softmax_lse)
    return (torch.zeros(out, dtype=_fia_out_dtype(query, quant_scale_out, query_rope)),
            torch.zeros(lse, dtype=torch.float32))


def npu_fused_infer_attention_score_v2_out(query, key, value, *, workspace=None, attention_out, softmax_lse, **kwargs):
    result = npu_fused_infer_attention_score_v2(query, key, value, **kwargs)
    return _write_out(result, attention_out, softmax_lse, kwargs.get("return_softmax_lse", False))


def npu_prompt_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
                               actual_seq_lengths=None, deq_scale1=None, quant_scale1=None, deq_scale2=None,
                               quant_scale2=None, quant_offset2=None, num_heads=1, scale_value=1.0,
                               pre_tokens=2147483647, next_tokens=0, input_layout="BSH", num_key_value_heads=0,
                               actual_seq_lengths_kv=None, sparse_mode=0):
    """Prefill attention: fused infer attention's math (note next_tokens defaults to 0 here, so a given
    sparse_mode-0 mask is also causal); sparse modes 10-14 are modes 0-4 in high precision."""
    if padding_mask is not None:
        raise _unsupported("npu_prompt_flash_attention", "padding_mask")
    if 10 <= sparse_mode <= 14:
        sparse_mode -= 10
    return npu_fused_infer_attention_score(
        query, key, value, pse_shift=pse_shift, atten_mask=atten_mask, actual_seq_lengths=actual_seq_lengths,
        actual_seq_lengths_kv=actual_seq_lengths_kv, dequant_scale1=deq_scale1, quant_scale1=quant_scale1,
        dequant_scale2=deq_scale2, quant_scale2=quant_scale2, quant_offset2=quant_offset2, num_heads=num_heads,
        scale=scale_value, pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
        num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode)[0]


def _pfa_meta(query, key, value, *, quant_scale2=None, input_layout="BSH", **_):
    shape = list(query.shape)
    if input_layout == "TND":
        shape = [query.size(0), query.size(1), value.size(2)]
    elif input_layout == "BNSD_BSND":
        shape = [query.size(0), query.size(2), query.size(1), query.size(3)]
    dtype = torch.int8 if quant_scale2 is not None else torch.float16 if query.dtype == torch.int8 else query.dtype
    return query.new_empty(shape, dtype=dtype)


def npu_incre_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
                              actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
                              dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
                              quant_offset2=None, kv_padding_size=None, num_heads=1, scale_value=1.0,
                              input_layout="BSH", num_key_value_heads=0, block_size=0, inner_precise=1):
    """Decode attention (one query token per batch): fused infer attention's math with
    ``actual_seq_lengths`` as the per-batch KV lengths; a block_table reads KV from a paged cache."""
    if padding_mask is not None:
        raise _unsupported("npu_incre_flash_attention", "padding_mask")
    return npu_fused_infer_attention_score(
        query, key, value, pse_shift=pse_shift, atten_mask=atten_mask, actual_seq_lengths_kv=actual_seq_lengths,
        antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset, block_table=block_table,
        dequant_scale1=dequant_scale1, quant_scale1=quant_scale1, dequant_scale2=dequant_scale2,
        quant_scale2=quant_scale2, quant_offset2=quant_offset2, kv_padding_size=kv_padding_size, num_heads=num_heads,
        scale=scale_value, input_layout=input_layout, num_key_value_heads=num_key_value_heads,
        block_size=block_size)[0]


def _ifa_meta(query, key, value, *, quant_scale2=None, **_):
    dtype = torch.int8 if quant_scale2 is not None else torch.float16 if query.dtype == torch.int8 else query.dtype
    return torch.empty_like(query, dtype=dtype)


def _with_schema_signature(fn, schema: str):
    """``fn(*args, **kwargs)`` given the exact signature of ``schema`` (for overloads whose long argument
    lists are forwarded unchanged), so introspection and argument checks see the real parameters."""
    parsed = torch._C.parse_schema(schema)
    params, kind = [], inspect.Parameter.POSITIONAL_OR_KEYWORD
    for arg in parsed.arguments:
        kind = inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
        params.append(inspect.Parameter(arg.name, kind, default=default))
    def forward(*args, **kwargs):
        return fn(*args, **kwargs)

    functools.update_wrapper(forward, fn)
    forward.__signature__ = inspect.Signature(params)
    return forward


# The verbatim torch_npu 2.14.0 schemas, from the generated table (tools/gen_op_schemas.py).
_S_NPU_FUSED_INFER_ATTENTION_SCORE_OUT = generated("npu_fused_infer_attention_score.out")
_S_NPU_FUSED_INFER_ATTENTION_SCORE_GET_MAX_WORKSPACE = generated("_npu_fused_infer_attention_score_get_max_workspace")
_S_NPU_FUSED_INFER_ATTENTION_SCORE_INFER_OUTPUT = generated("_npu_fused_infer_attention_score_infer_output")
_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2 = generated("npu_fused_infer_attention_score_v2")
_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_OUT = generated("npu_fused_infer_attention_score_v2.out")
_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_GET_MAX_WORKSPACE = generated("_npu_fused_infer_attention_score_v2_get_max_workspace")
_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_INFER_OUTPUT = generated("_npu_fused_infer_attention_score_v2_infer_output")
_S_NPU_PROMPT_FLASH_ATTENTION = generated("npu_prompt_flash_attention")
_S_NPU_INCRE_FLASH_ATTENTION = generated("npu_incre_flash_attention")


SPECS = [
    # No math yet; facts of TorchAir and torch.npu.graph about them.
    OpSpec(generated("npu_fusion_attention_v3"), graph_updatable=True),
    OpSpec("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor",
           npu_rotary_mul, vector(), autograd=(_rotary_mul_setup, _rotary_mul_grad)),
    OpSpec(generated("npu_rotary_mul_backward"), npu_rotary_mul_backward, vector()),
    OpSpec(generated("npu_attention_update"), npu_attention_update, vector(), meta=_attention_update_meta),
    OpSpec("npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
           "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
           "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
           "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
           "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
           "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
           "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
           "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
           "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
           "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
           "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
           "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
           "bool softmax_lse_flag=False) -> (Tensor, Tensor)", npu_fused_infer_attention_score, mix(), meta=_fia_meta,
           graph_updatable=True),
    OpSpec(_S_NPU_FUSED_INFER_ATTENTION_SCORE_OUT,
           _with_schema_signature(npu_fused_infer_attention_score_out, _S_NPU_FUSED_INFER_ATTENTION_SCORE_OUT), mix(),
           graph_updatable=True),
    # host-side helpers of torch.npu.graph's capture: a scratch buffer and the empty output buffers
    OpSpec(_S_NPU_FUSED_INFER_ATTENTION_SCORE_GET_MAX_WORKSPACE,
           _with_schema_signature(_workspace, _S_NPU_FUSED_INFER_ATTENTION_SCORE_GET_MAX_WORKSPACE),
           cores("AIV", limit_applies=False)),
    OpSpec(_S_NPU_FUSED_INFER_ATTENTION_SCORE_INFER_OUTPUT, _npu_fused_infer_attention_score_infer_output,
           cores("AIV", limit_applies=False)),
    OpSpec(_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2, npu_fused_infer_attention_score_v2, mix(), meta=_fia_v2_meta,
           graph_updatable=True),
    OpSpec(_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_OUT,
           _with_schema_signature(npu_fused_infer_attention_score_v2_out, _S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_OUT),
           mix(), graph_updatable=True),
    OpSpec(_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_GET_MAX_WORKSPACE,
           _with_schema_signature(_workspace, _S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_GET_MAX_WORKSPACE),
           cores("AIV", limit_applies=False)),
    OpSpec(_S_NPU_FUSED_INFER_ATTENTION_SCORE_V2_INFER_OUTPUT, _npu_fused_infer_attention_score_v2_infer_output,
           cores("AIV", limit_applies=False)),
    OpSpec(_S_NPU_PROMPT_FLASH_ATTENTION, npu_prompt_flash_attention, mix(), meta=_pfa_meta),
    OpSpec(_S_NPU_INCRE_FLASH_ATTENTION, npu_incre_flash_attention, mix(), meta=_ifa_meta),
]
