"""ATB self-attention over unpadded (concatenated) sequences: _npu_flash_attention_unpad(_v2) and
_npu_flash_attention (the same with an additive mask).

Who calls them: vLLM-Ascend's vision-encoder attention (``mm_encoder_attention``, ``DeviceOperator.
npu_flash_attention``: no mask, each image's patches attend to each other) and its 310P prefill path
(``_npu_flash_attention`` with the causal mask it builds).

Layout (ATB PA_ENCODER): query [num_tokens, num_heads, head_size] (or [num_tokens, num_heads * head_size]),
key/value [num_tokens, num_kv_heads, head_size]; ``seq_len`` (a host tensor) lists the batch's sequence
lengths, whose tokens lie one after the other.  Per sequence and head h (kv head ``h // (num_heads //
num_kv_heads)``): ``out = softmax(q k^T * scale_value + mask) v``, in float32, written into ``out``.
``mask`` (``_npu_flash_attention``) is additive: [max_seq, max_seq] for every sequence, [batch, max_seq,
max_seq] per sequence, or [batch, num_heads, max_seq, max_seq]; each sequence uses its top-left
[len, len].  float32 inputs are refused, as the kernel does (vLLM-Ascend falls back to
npu_fusion_attention for them).
"""
from __future__ import annotations

import torch

from ._common import _check
from .spec import OpSpec, cores, generated

_HALF = (torch.float16, torch.bfloat16)


def _heads(op, name, t, heads):
    if t.dim() == 2:
        _check(t.size(1) % heads == 0, lambda: f"{op}: {name}'s hidden size {t.size(1)} is not a multiple of {heads} heads")
        return t.reshape(t.size(0), heads, -1)
    _check(t.dim() == 3 and t.size(1) == heads,
           lambda: f"{op}: {name} must be [num_tokens, {heads}, head_size], but got {list(t.shape)}")
    return t


def _unpad(op, query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out, mask=None):
    _check(num_heads > 0, lambda: f"{op}: num_heads must be greater than 0, but got {num_heads}")
    kv_heads = num_kv_heads or num_heads
    _check(num_heads % kv_heads == 0,
           lambda: f"{op}: num_heads ({num_heads}) must be a multiple of num_kv_heads ({kv_heads})")
    _check(query.dtype in _HALF and key.dtype == query.dtype and value.dtype == query.dtype,
           lambda: f"{op}: query, key and value must all be float16 or bfloat16, but got {query.dtype}, "
                   f"{key.dtype}, {value.dtype}")
    q = _heads(op, "query", query, num_heads)
    k = _heads(op, "key", key, kv_heads)
    v = _heads(op, "value", value, kv_heads)
    lens = [int(n) for n in seq_len.reshape(-1).tolist()]
    total = sum(lens)
    _check(all(n >= 0 for n in lens) and total <= q.size(0) and total <= k.size(0),
           lambda: f"{op}: seq_len {lens} sums to {total}, more than the {q.size(0)} tokens of query")
    _check(out.numel() == q.numel(), lambda: f"{op}: out must have the shape of query {list(query.shape)}, but got "
                                             f"{list(out.shape)}")
    group = num_heads // kv_heads
    result = out.reshape(q.shape[0], num_heads, -1)
    start = 0
    for b, n in enumerate(lens):
        if n == 0:
            continue
        qs = q[start:start + n].float().transpose(0, 1)                                     # [H, n, D]
        ks = k[start:start + n].float().transpose(0, 1).repeat_interleave(group, dim=0)
        vs = v[start:start + n].float().transpose(0, 1).repeat_interleave(group, dim=0)
        scores = qs @ ks.transpose(1, 2) * scale_value                                        # [H, n, n]
        if mask is not None:
            m = mask[b] if mask.dim() >= 3 else mask
            scores = scores + m[..., :n, :n].float()
        result[start:start + n] = (torch.softmax(scores, dim=-1) @ vs).transpose(0, 1).to(out.dtype)
        start += n
    if result.data_ptr() != out.data_ptr() or result.shape != out.shape:
        out.copy_(result.reshape(out.shape))


def _npu_flash_attention_unpad(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out):
    _unpad("_npu_flash_attention_unpad", query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out)


def _npu_flash_attention_unpad_v2(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, *, kernel_type=0,
                                  out):
    _check(kernel_type in (0, 1, None),
           lambda: f"_npu_flash_attention_unpad_v2: kernel_type must be 0 (default) or 1 (high precision), but got "
                   f"{kernel_type}")
    _unpad("_npu_flash_attention_unpad_v2", query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out)


def _npu_flash_attention(query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, out):
    op = "_npu_flash_attention"
    batch = seq_len.numel()
    _check(mask.dim() == 2 or (mask.dim() in (3, 4) and mask.size(0) == batch),
           lambda: f"{op}: mask must be [max_seq, max_seq], [batch={batch}, max_seq, max_seq] or [batch, num_heads, "
                   f"max_seq, max_seq], but got {list(mask.shape)}")
    longest = max([int(n) for n in seq_len.reshape(-1).tolist()] or [0])
    _check(mask.size(-1) >= longest and mask.size(-2) >= longest,
           lambda: f"{op}: mask {list(mask.shape)} is smaller than the longest sequence ({longest})")
    _unpad(op, query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out, mask=mask)


_ATB_ATTENTION = cores("ATB", cube="all", vector="all")

SPECS = [
    OpSpec(generated("_npu_flash_attention_unpad"), _npu_flash_attention_unpad, _ATB_ATTENTION, namespace="atb",
           meta=lambda *args: None),
    OpSpec(generated("_npu_flash_attention_unpad_v2"), _npu_flash_attention_unpad_v2, cores("ATB", cube="all",
                                                                                             vector="all"),
           namespace="atb", meta=lambda *args, **kwargs: None),
    OpSpec(generated("_npu_flash_attention"), _npu_flash_attention, cores("ATB", cube="all", vector="all"),
           namespace="atb", meta=lambda *args: None),
]
