"""DeepSeek-V3.2's lightning indexer: npu_lightning_indexer, npu_quant_lightning_indexer.

Who calls them: vLLM-Ascend's sparse-flash-attention (SFA/DSA) backends pick, for every query token, the
``sparse_count`` key positions the sparse attention then reads (``layout_query="TND"``,
``layout_key="PA_BSND"``: the indexer keys live in a paged cache).

Math (DeepSeek-V3.2's index score): for query token t and key position s of the same batch,
``I[t, s] = sum_h weights[t, h] * relu(q[t, h] . k[s, n])`` over the N1 query heads of key head n
(N1 / N2 query heads per key head), in float32.  ``sparse_mode=3`` (right-down causal) lets query token i
of a batch with S1 query and S2 key tokens see keys 0 .. S2 - S1 + i (``pre_tokens``/``next_tokens`` bound
that band further); ``sparse_mode=0`` sees all S2 keys.  The result is the positions (within the batch's
sequence) of the ``sparse_count`` largest scores, best first (equal scores: the lower position first),
padded with -1 where fewer keys are visible; ``return_value`` also returns those scores (padding: -inf).

Layouts: query BSND [B, S1, N1, D] (weights [B, S1, N1]) or TND [T, N1, D] (weights [T, N1];
``actual_seq_lengths_query`` is then required and cumulative); key BSND [B, S2, N2, D], TND [T2, N2, D]
(``actual_seq_lengths_key`` cumulative) or PA_BSND [blocks, block_size, N2, D] with ``block_table``
[B, max_blocks] and per-batch ``actual_seq_lengths_key``.  Output: [B, S1, N2, k] (BSND query) or
[T, N2, k] (TND).  Query tokens past a batch's actual length get -1.

The quant form takes int8 (or float8) query/key with per-token-head dequant scales:
``q . k`` becomes ``(q . k) * query_dequant_scale[t, h] * key_dequant_scale[s, n]``.
"""
from __future__ import annotations

import torch

from ._common import _check, _unsupported
from .spec import OpSpec, generated, mix

_LI = "npu_lightning_indexer"
_QLI = "npu_quant_lightning_indexer"
_BIG = 9223372036854775807


def _required(**tensors) -> None:
    for name, item in tensors.items():
        _check(item is not None, lambda: f"{name} should not be None, but the actual value is None")


def _common_checks(query, key, sparse_count, sparse_mode, layout_query, layout_key) -> None:
    _check(query.numel() > 0, "Input query should not be empty.")
    _check(key.numel() > 0, "Input key should not be empty.")
    _check(sparse_count > 0, lambda: f"sparse_count should be greater than 0, but got {sparse_count}")
    _check(layout_query in ("BSND", "TND"), lambda: f"layout_query only supports BSND and TND, but got {layout_query}")
    _check(layout_key in ("BSND", "TND", "PA_BSND"),
           lambda: f"layout_key only supports PA_BSND, BSND and TND, but got {layout_key}")
    _check(sparse_mode in (0, 3), lambda: f"sparse_mode only supports 0 and 3, but got {sparse_mode}")


def _lengths(values, count: int, full: int, cumulative: bool):
    """Per-batch (start, length) from an optional actual-lengths tensor."""
    if values is None:
        return [(b * full, full) for b in range(count)]
    v = [int(x) for x in values.reshape(-1).tolist()]
    if cumulative:
        starts = [0] + v[:-1]
        return [(s, e - s) for s, e in zip(starts, v)]
    return [(b * full, n) for b, n in enumerate(v)]


def _batch_keys(key, layout_key, b, start, length, block_table):
    """The batch's key rows [S2, N2, D]."""
    if layout_key == "PA_BSND":
        block_size = key.size(1)
        pos = torch.arange(length)
        blocks = block_table[b].to(torch.int64)[pos // block_size]
        return key[blocks, pos % block_size]
    if layout_key == "BSND":
        return key[b, :length]
    return key[start:start + length]


def _indexer(op, query, key, weights, actual_seq_lengths_query, actual_seq_lengths_key, block_table, layout_query,
             layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens, return_value, q_scale=None, k_scale=None):
    _common_checks(query, key, sparse_count, sparse_mode, layout_query, layout_key)
    if layout_query == "TND":
        _check(actual_seq_lengths_query is not None,
               f"{op}: actual_seq_lengths_query is required when layout_query is TND")
        batch = actual_seq_lengths_query.numel()
        q_rows = _lengths(actual_seq_lengths_query, batch, 0, cumulative=True)
    else:
        batch = query.size(0)
        q_rows = _lengths(actual_seq_lengths_query, batch, query.size(1), cumulative=False)
    if layout_key == "PA_BSND":
        _check(block_table is not None and block_table.dim() == 2 and block_table.size(0) == batch,
               lambda: f"{op}: layout_key PA_BSND needs a 2-D block_table with {batch} rows")
        _check(actual_seq_lengths_key is not None, f"{op}: actual_seq_lengths_key is required when layout_key is PA_BSND")
        k_rows = _lengths(actual_seq_lengths_key, batch, 0, cumulative=False)
    elif layout_key == "TND":
        _check(actual_seq_lengths_key is not None, f"{op}: actual_seq_lengths_key is required when layout_key is TND")
        k_rows = _lengths(actual_seq_lengths_key, batch, 0, cumulative=True)
    else:
        k_rows = _lengths(actual_seq_lengths_key, batch, key.size(1), cumulative=False)
    n1, n2 = query.size(-2), key.size(-2)
    _check(n1 % n2 == 0, lambda: f"{op}: the query heads N1 ({n1}) must be a multiple of the key heads N2 ({n2})")
    _check(query.size(-1) == key.size(-1), lambda: f"{op}: query and key must have the same head dim D")
    group = n1 // n2

    q_flat = query if layout_query == "TND" else query.reshape(-1, n1, query.size(-1))
    w_flat = weights.reshape(-1, n1).float()
    qs_flat = None if q_scale is None else q_scale.reshape(-1, n1).float()
    tokens = q_flat.size(0)
    indices = torch.full((tokens, n2, sparse_count), -1, dtype=torch.int32)
    values = torch.full((tokens, n2, sparse_count), float("-inf"), dtype=torch.float32)
    for b in range(batch):
        q_start, s1 = q_rows[b] if layout_query == "TND" else (b * query.size(1), q_rows[b][1])
        k_start, s2 = k_rows[b]
        if s1 <= 0 or s2 <= 0:
            continue
        keys = _batch_keys(key, layout_key, b, k_start, s2, block_table).float()             # [S2, N2, D]
        if k_scale is not None:
            ks = _batch_keys(k_scale, layout_key, b, k_start, s2, block_table).float()        # [S2, N2]
            keys = keys * ks.unsqueeze(-1)
        q = q_flat[q_start:q_start + s1].float()                                                # [S1, N1, D]
        if qs_flat is not None:
            q = q * qs_flat[q_start:q_start + s1].unsqueeze(-1)
        w = w_flat[q_start:q_start + s1]                                                        # [S1, N1]
        keys_per_head = keys.repeat_interleave(group, dim=1)                                   # [S2, N1, D]
        dots = torch.relu(torch.einsum("thd,shd->ths", q, keys_per_head))                      # [S1, N1, S2]
        scores = (dots * w.unsqueeze(-1)).reshape(s1, n2, group, s2).sum(dim=2)               # [S1, N2, S2]
        i = torch.arange(s1).unsqueeze(1)
        s = torch.arange(s2).unsqueeze(0)
        visible = torch.ones(s1, s2, dtype=torch.bool)
        if sparse_mode == 3:
            diagonal = s2 - s1 + i
            band = s1 + s2                          # pre/next_tokens default to 2**63 - 1: keep the arithmetic in range
            visible = (s <= diagonal) & (s >= diagonal - min(pre_tokens, band)) & (s <= diagonal + min(next_tokens, band))
        scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
        ordered, order = torch.sort(scores, dim=-1, descending=True, stable=True)
        k = min(sparse_count, s2)
        keep = torch.isfinite(ordered[..., :k])
        indices[q_start:q_start + s1, :, :k] = torch.where(keep, order[..., :k], -1).to(torch.int32)
        values[q_start:q_start + s1, :, :k] = torch.where(keep, ordered[..., :k], float("-inf"))
    if layout_query == "BSND":
        indices = indices.reshape(query.size(0), query.size(1), n2, sparse_count)
        values = values.reshape(query.size(0), query.size(1), n2, sparse_count)
    if return_value:
        return indices, values.to(query.dtype if query.is_floating_point() else weights.dtype)
    return indices, query.new_empty([0], dtype=query.dtype)


def npu_lightning_indexer(query, key, weights, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                          block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048, sparse_mode=3,
                          pre_tokens=_BIG, next_tokens=_BIG, return_value=False):
    _required(query=query, key=key, weights=weights)
    return _indexer(_LI, query, key, weights, actual_seq_lengths_query, actual_seq_lengths_key, block_table,
                    layout_query, layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens, return_value)


def _out_shape(query, key, layout_query, layout_key, sparse_count):
    if layout_query == "BSND":
        return [query.size(0), query.size(1), key.size(2), sparse_count]
    return [query.size(0), key.size(1 if layout_key == "TND" else 2), sparse_count]


def _lightning_indexer_meta(query, key, weights, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                            block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                            sparse_mode=3, pre_tokens=_BIG, next_tokens=_BIG, return_value=False):
    _required(query=query, key=key, weights=weights)
    _check(query.numel() > 0, "Input query should not be empty.")
    _check(key.numel() > 0, "Input key should not be empty.")
    _check(sparse_count > 0, lambda: f"sparse_count should be greater than 0, but got {sparse_count}")
    shape = _out_shape(query, key, layout_query, layout_key, sparse_count)
    values = query.new_empty(shape if return_value else [0], dtype=query.dtype)
    return query.new_empty(shape, dtype=torch.int32), values


def npu_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                key_quant_mode, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                                block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                                sparse_mode=3, pre_tokens=_BIG, next_tokens=_BIG, query_dtype=None, key_dtype=None):
    _required(query=query, key=key, weights=weights, query_dequant_scale=query_dequant_scale,
              key_dequant_scale=key_dequant_scale)
    _check(query_quant_mode == 0 and key_quant_mode == 0,
           lambda: f"{_QLI}: query_quant_mode and key_quant_mode only support 0 (per-token-head), but got "
                   f"{query_quant_mode} and {key_quant_mode}")
    if query_dtype is not None or key_dtype is not None:
        raise _unsupported(_QLI, "query_dtype / key_dtype (HiFloat8 operands)")
    indices, _ = _indexer(_QLI, query, key, weights, actual_seq_lengths_query, actual_seq_lengths_key, block_table,
                          layout_query, layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens, False,
                          q_scale=query_dequant_scale, k_scale=key_dequant_scale)
    return indices


def _quant_lightning_indexer_meta(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                  key_quant_mode, *, layout_query="BSND", layout_key="BSND", sparse_count=2048, **_):
    _check(sparse_count > 0, lambda: f"sparse_count should be greater than 0, but got {sparse_count}")
    return query.new_empty(_out_shape(query, key, layout_query, layout_key, sparse_count), dtype=torch.int32)


SPECS = [
    OpSpec(generated(_LI), npu_lightning_indexer, mix(), meta=_lightning_indexer_meta),
    OpSpec(generated(_QLI), npu_quant_lightning_indexer, mix(), meta=_quant_lightning_indexer_meta),
]
