"""Paged KV cache: the ATB ops (``torch.ops.atb``) ``_npu_reshape_and_cache``, which writes new
key/value rows into block caches, and ``_npu_paged_attention``, which decodes against them; and the
aclnn op ``npu_scatter_pa_kv_cache(_functional)`` that newer vLLM-Ascend uses for the same write; and its
inverse ``npu_gather_pa_kv_cache(_functional)``, which copies each sequence's cached rows back into one
contiguous ``[num_tokens, heads, head_size]`` key/value (vLLM-Ascend's MLA chunked-prefill context load and
its KV-transfer connectors).

Why: vLLM-Ascend's decode path calls ``torch_npu._npu_reshape_and_cache(key, value, key_cache,
value_cache, slot_indices)`` then ``torch_npu._npu_paged_attention(query, key_cache, value_cache,
num_kv_heads, num_heads, scale_value, block_table, context_lens, out=out)`` every step.

Layouts (ND, as vLLM-Ascend allocates them): caches ``[num_blocks, block_size, num_kv_heads, head_size]``;
``slot_indices[i] = block * block_size + offset`` is where row ``i`` goes (negative: a padding token,
skipped); ``block_table[b]`` lists sequence ``b``'s blocks, ``context_lens[b]`` (a host tensor in
vLLM-Ascend) its length (0: a padding request, whose output is zeros here).  ``npu_scatter_pa_kv_cache`` takes ``cache_mode="Norm"`` for that ND layout and
``"PA_NZ"`` (its default) for the fractal layout ``[num_blocks, heads * head_size // last, block_size,
last]``, where a token's row is laid out in ``last``-wide columns; the compression arguments are not
emulated.  Grouped-query attention: query head ``h`` reads kv head
``h // (num_heads // num_kv_heads)``.  Duplicate slots: the last row wins (the device leaves it
undefined).
"""
from __future__ import annotations

import torch

from ._common import _check
from .layout import storage_format
from .spec import OpSpec, cores, generated, vector

_INT_INDICES = (torch.int32, torch.int64)


def _write_rows(rows: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, op: str, what: str,
                slot_name: str = "slot_indices") -> None:
    _check(rows.dim() == 3, lambda: f"{op}: {what} must be 3-dimensional [num_tokens, num_heads, head_size], "
                                    f"but got {rows.dim()} dims")
    _check(cache.dim() == 4, lambda: f"{op}: {what}_cache must be 4-dimensional [num_blocks, block_size, num_heads, "
                                     f"head_size], but got {cache.dim()} dims")
    _check(tuple(rows.shape[1:]) == tuple(cache.shape[2:]),
           lambda: f"{op}: {what} rows {list(rows.shape[1:])} do not match {what}_cache's [num_heads, head_size] "
                   f"{list(cache.shape[2:])}")
    _check(rows.dtype == cache.dtype, lambda: f"{op}: {what} dtype {rows.dtype} must match {what}_cache dtype "
                                              f"{cache.dtype}")
    _check(slots.dtype in _INT_INDICES, lambda: f"{op}: {slot_name} must be int32, but got {slots.dtype}")
    _check(slots.dim() == 1 and slots.numel() == rows.size(0),
           lambda: f"{op}: {slot_name} must have shape [{rows.size(0)}] (one slot per token), but got "
                   f"{list(slots.shape)}")
    capacity = cache.size(0) * cache.size(1)
    flat = cache.view(capacity, *cache.shape[2:])
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        _check(slot < capacity, lambda: f"{op}: {slot_name}[{i}] = {slot} is out of range for a cache of "
                                        f"{cache.size(0)} blocks x {cache.size(1)} slots")
        flat[slot] = rows[i]


def _write_rows_nz(rows: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, op: str, what: str,
                   slot_name: str = "slot_mapping") -> None:
    """PA_NZ: row ``i`` (heads * head_size values) goes to ``cache[block, :, offset, :]`` in
    ``cache.size(-1)``-wide columns."""
    _check(cache.dim() == 4, lambda: f"{op}: {what}_cache must be 4-dimensional in PA_NZ [num_blocks, "
                                     f"heads * head_size // last, block_size, last], but got {cache.dim()} dims")
    width = rows[0].numel() if rows.size(0) else 0
    _check(rows.size(0) == 0 or cache.size(1) * cache.size(3) == width,
           lambda: f"{op}: a {what} row of {width} values does not fill {what}_cache's PA_NZ columns "
                   f"{cache.size(1)} x {cache.size(3)}")
    _check(rows.dtype == cache.dtype, lambda: f"{op}: {what} dtype {rows.dtype} must match {what}_cache dtype "
                                              f"{cache.dtype}")
    _check(slots.dim() == 1 and slots.numel() == rows.size(0),
           lambda: f"{op}: slot_mapping must have shape [{rows.size(0)}] (one slot per token), but got "
                   f"{list(slots.shape)}")
    block_size = cache.size(2)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        _check(slot < cache.size(0) * block_size, lambda: f"{op}: slot_mapping[{i}] = {slot} is out of range")
        cache[slot // block_size, :, slot % block_size, :] = rows[i].reshape(cache.size(1), cache.size(3))


def _scatter_pa(key, value, key_cache, value_cache, slot_mapping, compress_lens, compress_seq_offsets, seq_lens,
                cache_mode, op):
    _check(compress_lens is None and compress_seq_offsets is None and seq_lens is None,
           lambda: f"{op}: compress_lens, compress_seq_offsets and seq_lens (KV compression) are not emulated")
    _check(cache_mode in ("Norm", "PA_NZ"),
           lambda: f"{op}: cache_mode {cache_mode!r} is not emulated (Norm and PA_NZ are)")
    write = _write_rows if cache_mode == "Norm" else _write_rows_nz
    write(key, key_cache, slot_mapping, op, "key", "slot_mapping")
    write(value, value_cache, slot_mapping, op, "value", "slot_mapping")


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                            compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    _scatter_pa(key, value, key_cache, value_cache, slot_mapping, compress_lens, compress_seq_offsets, seq_lens,
                cache_mode, "npu_scatter_pa_kv_cache")


def npu_scatter_pa_kv_cache_functional(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                                       compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    _scatter_pa(key, value, key_cache, value_cache, slot_mapping, compress_lens, compress_seq_offsets, seq_lens,
                cache_mode, "npu_scatter_pa_kv_cache_functional")
    return key_cache, value_cache


_FRACTAL_NZ = 29


def _gather_pa(key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset, is_seq_lens_cumsum, op):
    """GatherPaKvCache (CANN aclnnGatherPaKvCache): sequence ``b``'s ``n_b`` tokens, in order, go to the next
    ``n_b`` rows of ``key``/``value``.  Token ``j`` of sequence ``b`` is cached in block
    ``block_tables[b, seq_offset[b] // block_size + j // block_size]`` at slot ``j % block_size`` (the offset
    only moves the first block, as the aclnn doc says).  ``n_b`` is ``seq_lens[b]``, or
    ``seq_lens[b+1] - seq_lens[b]`` when ``is_seq_lens_cumsum``.  The cache layout is the one torch_npu
    picks from ``get_npu_format(key_cache)``: FRACTAL_NZ -> "PA_NZ" (caches
    ``[num_blocks, heads * head_size // last, block_size, last]``, a token's row read ``last``-wide),
    else "Norm" (``[num_blocks, block_size, heads, head_size]``).  Rows past ``key.size(0)`` are not
    written (the kernel stops when the output is full); rows past the gathered tokens keep their values.
    """
    nz = storage_format(key_cache) == _FRACTAL_NZ
    for name, cache, out in (("key", key_cache, key), ("value", value_cache, value)):
        _check(cache.dim() == 4, lambda: f"{op}: {name}_cache must be 4-dimensional, but got {cache.dim()} dims")
        _check(out.dtype == cache.dtype, lambda: f"{op}: {name} dtype {out.dtype} must match {name}_cache dtype "
                                                 f"{cache.dtype}")
        if nz:
            width = out[0].numel() if out.size(0) else cache.size(1) * cache.size(3)
            _check(cache.size(1) * cache.size(3) == width,
                   lambda: f"{op}: a {name} row of {width} values does not match {name}_cache's PA_NZ columns "
                           f"{cache.size(1)} x {cache.size(3)}")
        else:
            _check(out.dim() == 3 and tuple(out.shape[1:]) == tuple(cache.shape[2:]),
                   lambda: f"{op}: {name} must be [num_tokens, {cache.size(2)}, {cache.size(3)}] for a {name}_cache "
                           f"of {list(cache.shape)}, but got {list(out.shape)}")
    _check(key.size(0) == value.size(0), lambda: f"{op}: key and value must have the same number of tokens, but got "
                                                 f"{key.size(0)} and {value.size(0)}")
    _check(value_cache.size(0) == key_cache.size(0) and value_cache.size(-2 if nz else 1) == key_cache.size(
        -2 if nz else 1), lambda: f"{op}: key_cache {list(key_cache.shape)} and value_cache "
                                  f"{list(value_cache.shape)} must have the same blocks and block_size")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)) + (
            (("seq_offset", seq_offset),) if seq_offset is not None else ()):
        _check(t.dtype in _INT_INDICES, lambda: f"{op}: {name} must be int32 or int64, but got {t.dtype}")
    _check(block_tables.dim() == 2, lambda: f"{op}: block_tables must be 2-dimensional [batch, max_blocks], but "
                                            f"got {list(block_tables.shape)}")
    lens = seq_lens.reshape(-1).tolist()
    if is_seq_lens_cumsum:
        _check(len(lens) >= 1 and lens[0] == 0,
               lambda: f"{op}: with is_seq_lens_cumsum=True seq_lens holds batch + 1 cumulative lengths starting at "
                       f"0, but got {lens}")
        lens = [b - a for a, b in zip(lens, lens[1:])]
    batch = len(lens)
    _check(block_tables.size(0) == batch,
           lambda: f"{op}: block_tables has {block_tables.size(0)} rows but seq_lens gives {batch} sequences"
                   + (" (batch + 1 values with is_seq_lens_cumsum=True)" if is_seq_lens_cumsum else ""))
    offsets = [0] * batch if seq_offset is None else seq_offset.reshape(-1).tolist()
    _check(len(offsets) == batch, lambda: f"{op}: seq_offset must hold {batch} offsets, but got {len(offsets)}")
    num_blocks, block_size = key_cache.size(0), key_cache.size(2 if nz else 1)
    table = block_tables.tolist()
    row = 0
    for b, (length, offset) in enumerate(zip(lens, offsets)):
        _check(length >= 0 and offset >= 0,
               lambda: f"{op}: sequence {b} has length {length} and offset {offset}; both must be >= 0")
        first = offset // block_size
        for j in range(length):
            if row >= key.size(0):
                return
            index = first + j // block_size
            _check(index < len(table[b]),
                   lambda: f"{op}: sequence {b} needs block_tables[{b}][{index}] (token {j}, seq_offset {offset}), "
                           f"but block_tables has {len(table[b])} columns")
            block = table[b][index]
            _check(0 <= block < num_blocks, lambda: f"{op}: block_tables[{b}][{index}] = {block} is out of range "
                                                    f"[0, {num_blocks})")
            slot = j % block_size
            if nz:
                key[row] = key_cache[block, :, slot, :].reshape(key[row].shape)
                value[row] = value_cache[block, :, slot, :].reshape(value[row].shape)
            else:
                key[row] = key_cache[block, slot]
                value[row] = value_cache[block, slot]
            row += 1


def npu_gather_pa_kv_cache(key_cache, value_cache, block_tables, seq_lens, key, value, *, seq_offset=None,
                           is_seq_lens_cumsum=False):
    _gather_pa(key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset, is_seq_lens_cumsum,
               "npu_gather_pa_kv_cache")


def npu_gather_pa_kv_cache_functional(key_cache, value_cache, block_tables, seq_lens, key, value, *, seq_offset=None,
                                      is_seq_lens_cumsum=False):
    key, value = key.clone(), value.clone()
    _gather_pa(key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset, is_seq_lens_cumsum,
               "npu_gather_pa_kv_cache_functional")
    return key, value


def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    op = "_npu_reshape_and_cache"
    _write_rows(key, key_cache, slot_indices, op, "key")
    _write_rows(value, value_cache, slot_indices, op, "value")


def _npu_reshape_and_cache_siso(key, key_cache, slot_indices):
    _write_rows(key, key_cache, slot_indices, "_npu_reshape_and_cache_siso", "key")


def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                         context_lens, out, *, workspace=None):
    op = "_npu_paged_attention"
    _check(query.dim() == 3 and query.size(1) == num_heads,
           lambda: f"{op}: query must be [batch, num_heads={num_heads}, head_size], but got {list(query.shape)}")
    _check(num_kv_heads > 0 and num_heads % num_kv_heads == 0,
           lambda: f"{op}: num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check(cache.dim() == 4 and cache.size(2) == num_kv_heads,
               lambda: f"{op}: {name} must be [num_blocks, block_size, num_kv_heads={num_kv_heads}, head_size], "
                       f"but got {list(cache.shape)}")
    _check(key_cache.size(-1) == query.size(-1),
           lambda: f"{op}: key_cache head_size {key_cache.size(-1)} must match query head_size {query.size(-1)}")
    batch, block_size = query.size(0), key_cache.size(1)
    _check(block_table.dtype in _INT_INDICES and block_table.dim() == 2 and block_table.size(0) == batch,
           lambda: f"{op}: block_table must be int32 [batch={batch}, max_blocks], but got {block_table.dtype} "
                   f"{list(block_table.shape)}")
    _check(context_lens.numel() == batch, lambda: f"{op}: context_lens must hold {batch} lengths, but got "
                                                  f"{context_lens.numel()}")
    expected = (batch, num_heads, value_cache.size(-1))
    _check(tuple(out.shape) == expected, lambda: f"{op}: out must have shape {list(expected)}, but got "
                                                 f"{list(out.shape)}")
    group = num_heads // num_kv_heads
    for b, length in enumerate(context_lens.reshape(-1).tolist()):
        _check(0 <= length <= block_table.size(1) * block_size,
               lambda: f"{op}: context_lens[{b}] = {length} must be in [0, {block_table.size(1) * block_size}] "
                       f"(max_blocks x block_size)")
        if length == 0:             # a padding request (graph-mode batches are padded): nothing to attend
            out[b] = 0
            continue
        pos = torch.arange(length)
        blocks = block_table[b].to(torch.int64)[pos // block_size]
        keys = key_cache[blocks, pos % block_size].float().repeat_interleave(group, dim=1)      # [L, H, D]
        values = value_cache[blocks, pos % block_size].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", query[b].float(), keys) * scale_value
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), values).to(out.dtype)


_WORKSPACE_BYTES = 64    # the CPU math needs no scratch memory; a small buffer stands for the kernel's


def _npu_paged_attention_get_workspace(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                                       block_table, context_lens, out):
    """The workspace ``_npu_paged_attention(..., workspace=)`` runs in (vLLM-Ascend asks for it before updating a
    captured decode step): a uint8 buffer; the arguments are those of the attention call it is for."""
    op = "_npu_paged_attention_get_workspace"
    _check(query.dim() == 3 and query.size(1) == num_heads,
           lambda: f"{op}: query must be [batch, num_heads={num_heads}, head_size], but got {list(query.shape)}")
    _check(num_kv_heads > 0 and num_heads % num_kv_heads == 0,
           lambda: f"{op}: num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    return torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8)


def _cache_load_lengths(block_table, context_lens, cumsum: bool) -> list:
    """Per-sequence lengths from context_lens: [batch] lengths, or with ``cumsum`` [batch] or [batch + 1]
    running sums (the doc allows both shapes)."""
    values = [int(v) for v in context_lens.reshape(-1).tolist()]
    if cumsum:
        ends = values[1:] if len(values) == block_table.size(0) + 1 else values
        starts = values[:1] + values[1:-1] if len(values) == block_table.size(0) + 1 else [0] + values[:-1]
        return [e - s for s, e in zip(starts, ends)]
    return values


def npu_paged_cache_load_out(key_cache, value_cache, block_table, context_lens, *, seq_starts=None, cumsum=False,
                             key, value):
    """ATB PagedCacheLoad: each sequence's cached tokens, in order, into consecutive rows of key/value.  Token j of
    sequence b is the sequence's position ``p = seq_starts[b] + j``: block ``block_table[b, p // block_size]``,
    slot ``p % block_size`` (caches ND ``[num_blocks, block_size, num_heads, head_size]``)."""
    op = "npu_paged_cache_load"
    for name, cache, out in (("key", key_cache, key), ("value", value_cache, value)):
        _check(cache.dim() == 4, lambda: f"{op}: {name}_cache must be [num_blocks, block_size, num_heads, head_size], "
                                         f"but got {list(cache.shape)}")
        _check(out.dim() == 3 and tuple(out.shape[1:]) == tuple(cache.shape[2:]) and out.dtype == cache.dtype,
               lambda: f"{op}: {name} must be {cache.dtype} [num_tokens, {cache.size(2)}, {cache.size(3)}], but got "
                       f"{out.dtype} {list(out.shape)}")
    _check(block_table.dtype in _INT_INDICES and block_table.dim() == 2,
           lambda: f"{op}: block_table must be int32 [batch, block_indices], but got {block_table.dtype} "
                   f"{list(block_table.shape)}")
    lens = _cache_load_lengths(block_table, context_lens, cumsum)
    batch = block_table.size(0)
    _check(len(lens) == batch, lambda: f"{op}: context_lens gives {len(lens)} sequences, block_table {batch}")
    starts = [0] * batch if seq_starts is None else [int(v) for v in seq_starts.reshape(-1).tolist()]
    _check(len(starts) == batch, lambda: f"{op}: seq_starts must hold {batch} values, but got {len(starts)}")
    _check(sum(lens) <= key.size(0) and sum(lens) <= value.size(0),
           lambda: f"{op}: key/value hold {key.size(0)}/{value.size(0)} rows, the sequences {sum(lens)}")
    block_size = key_cache.size(1)
    row = 0
    for b in range(batch):
        if lens[b] <= 0:
            continue
        pos = torch.arange(starts[b], starts[b] + lens[b])
        _check(int(pos[-1]) // block_size < block_table.size(1),
               lambda: f"{op}: sequence {b} reaches position {int(pos[-1])}, past its {block_table.size(1)} blocks")
        blocks = block_table[b].to(torch.int64)[pos // block_size]
        key[row:row + lens[b]] = key_cache[blocks, pos % block_size]
        value[row:row + lens[b]] = value_cache[blocks, pos % block_size]
        row += lens[b]
    return key, value


SPECS = [
    OpSpec(generated("_npu_paged_attention_get_workspace"), _npu_paged_attention_get_workspace,
           cores("AICPU", limit_applies=False), namespace="atb",
           meta=lambda query, *args, **kwargs: query.new_empty(_WORKSPACE_BYTES, dtype=torch.uint8)),
    # npu_paged_cache_load without key=/value= keeps no math: its output rows depend on context_lens' values
    OpSpec(generated("npu_paged_cache_load.out"), npu_paged_cache_load_out, cores("ATB", vector="all"),
           namespace="atb", meta=lambda *args, key, value, **kwargs: (key, value)),
    OpSpec(generated("npu_scatter_pa_kv_cache"), npu_scatter_pa_kv_cache, vector(), meta=lambda *args, **kwargs: None),
    OpSpec(generated("npu_scatter_pa_kv_cache_functional"), npu_scatter_pa_kv_cache_functional, vector(),
           meta=lambda key, value, key_cache, value_cache, *args, **kwargs: (torch.empty_like(key_cache),
                                                                              torch.empty_like(value_cache))),
    OpSpec(generated("npu_gather_pa_kv_cache"), npu_gather_pa_kv_cache, vector(), meta=lambda *args, **kwargs: None),
    OpSpec(generated("npu_gather_pa_kv_cache_functional"), npu_gather_pa_kv_cache_functional, vector(),
           meta=lambda key_cache, value_cache, block_tables, seq_lens, key, value, **kwargs: (
               torch.empty_like(key), torch.empty_like(value))),
    OpSpec(generated("_npu_reshape_and_cache"), _npu_reshape_and_cache, cores("ATB", vector="all"), namespace="atb",
           meta=lambda *args: None),
    OpSpec(generated("_npu_reshape_and_cache_siso"), _npu_reshape_and_cache_siso, cores("ATB", vector="all"),
           namespace="atb", meta=lambda *args: None),
    OpSpec(generated("_npu_paged_attention"), _npu_paged_attention, cores("ATB", cube="all", vector="all"),
           namespace="atb", graph_updatable=True, meta=lambda *args, **kwargs: None),
    # no math; torch_npu's npugraph handlers patch its context_lens in a captured graph, as _npu_paged_attention's;
    # meta: the wheel's (_atb_meta_registrations.py)
    OpSpec(generated("npu_multi_head_latent_attention"), cores=cores("ATB", cube="all", vector="all"), namespace="atb",
           graph_updatable=True,
           meta=lambda q_nope, q_rope, *args, **kwargs: torch.empty_like(q_nope, dtype=q_rope.dtype)),
]
