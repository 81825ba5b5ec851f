"""MoE gating and routing: top-k gating, init/finalize routing, expert token counts and the
Megatron-style token permute/unpermute (index conventions pinned by the torch_npu docstring examples)."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ._common import _check, _pertoken_int8, _stable_topk, _unsupported
from .spec import OpSpec, vector


# ----------------------------------------------------------------------------- MoE gating
def npu_moe_gating_top_k_softmax(x: torch.Tensor, finished: Optional[torch.Tensor] = None, k: int = 1):
    """Softmax over experts then top-k; returns (y, expert_idx int32, row_idx int32).

    ``row_idx[..., j] = j * num_rows + i`` for flattened row i.  A row whose ``finished`` flag is
    True reports expert index ``E`` (one past the last expert) so later routing drops it.
    """
    _check(x.dim() in (2, 3), "the x shape support only 2d and 3d)")
    experts = x.size(-1)
    _check(0 < k <= experts, lambda: f"npu_moe_gating_top_k_softmax: k must be in (0, {experts}], but got {k}")
    probs = torch.softmax(x.to(torch.float32), dim=-1)
    y, idx = _stable_topk(probs, k)
    if finished is not None:
        idx = torch.where(finished.to(torch.bool).unsqueeze(-1), torch.full_like(idx, experts), idx)
    num_rows = math.prod(x.shape[:-1])
    row_idx = (torch.arange(k) * num_rows + torch.arange(num_rows).unsqueeze(-1)).reshape(*x.shape[:-1], k)
    return y.to(x.dtype), idx.to(torch.int32), row_idx.to(torch.int32)


def npu_moe_gating_top_k(x: torch.Tensor, k: int, *, bias: Optional[torch.Tensor] = None,
                         input_ids: Optional[torch.Tensor] = None, tid2eid: Optional[torch.Tensor] = None,
                         k_group: int = 1, group_count: int = 1, group_select_mode: int = 0, renorm: int = 0,
                         norm_type: int = 0, out_flag: bool = False, routed_scaling_factor: float = 1.0,
                         eps: float = 1e-20):
    """Group-limited top-k routing (DeepSeek-V3 style), CANN aclnnMoeGatingTopK steps 1-6.

    norm = softmax/sigmoid(x); groups are scored on ``norm + bias`` (max, or top-2 sum); experts
    are picked from the best ``k_group`` groups on ``norm + bias``; the weights are gathered from
    ``norm`` (bias only steers selection) and renormalised: ``w / (sum(w) + eps) * factor``.
    Hash mode (``input_ids`` + ``tid2eid``) takes the experts from the table instead.
    """
    _check(x.dim() == 2, "the x shape support only 2d)")
    if bias is not None:
        _check(bias.dim() == 1, "the bias shape support only 1d)")
    _check((input_ids is None) == (tid2eid is None), "input_ids and tid2eid must be both provided or both omitted)")
    if input_ids is not None:
        _check(input_ids.dim() == 1, "the input_ids shape support only 1d)")
        _check(input_ids.size(0) == x.size(0), "The input_ids first dim should be same as x first dim)")
        _check(tid2eid.dim() == 2, "the tid2eid shape support only 2d)")
        _check(tid2eid.size(1) == k, "The tid2eid second dim should be same as k)")
    tokens, experts = x.shape
    _check(renorm == 0, lambda: f"npu_moe_gating_top_k: only renorm=0 is supported, but got {renorm}")
    _check(norm_type in (0, 1), lambda: f"npu_moe_gating_top_k: norm_type must be 0 (softmax) or 1 (sigmoid), "
                                        f"but got {norm_type}")
    _check(group_count > 0 and experts % group_count == 0,
           lambda: f"npu_moe_gating_top_k: the expert count {experts} must be divisible by group_count {group_count}")
    _check(1 <= k_group <= group_count,
           lambda: f"npu_moe_gating_top_k: k_group must be in [1, group_count={group_count}], but got {k_group}")
    per_group = experts // group_count
    _check(1 <= k <= per_group * k_group,
           lambda: f"npu_moe_gating_top_k: k must be in [1, {per_group * k_group}], but got {k}")
    _check(group_select_mode in (0, 1), lambda: f"npu_moe_gating_top_k: group_select_mode must be 0 or 1, "
                                                f"but got {group_select_mode}")
    logits = x.to(torch.float32)
    norm = torch.softmax(logits, dim=-1) if norm_type == 0 else torch.sigmoid(logits)
    if input_ids is not None:
        idx = tid2eid.to(torch.int64)[input_ids.to(torch.int64)]
    else:
        score = norm if bias is None else norm + bias.to(torch.float32)
        grouped = score.reshape(tokens, group_count, per_group)
        if group_select_mode == 0:
            group_score = grouped.amax(dim=-1)
        else:
            group_score = _stable_topk(grouped, min(2, per_group))[0].sum(dim=-1)
        _, best_groups = _stable_topk(group_score, k_group)
        keep = torch.zeros(tokens, group_count, dtype=torch.bool).scatter_(1, best_groups, True)
        masked = score.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        _, idx = _stable_topk(masked, k)
    weights = norm.gather(1, idx)
    y = weights / (weights.sum(dim=-1, keepdim=True) + eps) * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), norm


# ----------------------------------------------------------------------------- MoE routing
def _sort_by_expert(expert_idx: torch.Tensor):
    """Stable sort of the flattened (row-major) expert ids: (sorted experts, source positions)."""
    flat = expert_idx.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    return flat[order], order


def npu_moe_init_routing(x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int):
    """Sort the (token, k) pairs by expert and gather token rows into expert order.

    ``expanded_expert_idx, sorted_row_idx = stable key-value sort(expert_idx, row_idx)``;
    ``expanded_row_idx[sorted_row_idx[i]] = i``; ``expanded_x[i] = x[sorted_row_idx[i] % N]`` for the
    first ``min(N, active_num) * K`` rows.
    """
    n, k = x.size(0), expert_idx.size(1)
    sorted_experts, order = _sort_by_expert(expert_idx)
    sorted_rows = row_idx.reshape(-1).to(torch.int64)[order]
    expanded_row_idx = torch.zeros(n * k, dtype=torch.int64)
    expanded_row_idx[sorted_rows] = torch.arange(n * k)
    expanded_x = x[sorted_rows[:min(n, active_num) * k] % n]
    return expanded_x, expanded_row_idx.to(torch.int32), sorted_experts.to(torch.int32)


def _token_counts_output(counts: torch.Tensor, start: int, expert_num: int, kind: int, flag: bool) -> torch.Tensor:
    """expert_token_cumsum_or_count: 0 cumsum, 1 count over the active range, 2 (expert, count) pairs."""
    if not flag:
        return torch.zeros(0, dtype=torch.int64)
    if kind == 0:
        return counts.cumsum(0)
    if kind == 1:
        return counts
    pairs = torch.zeros(expert_num, 2, dtype=torch.int64)
    present = torch.nonzero(counts).flatten()
    pairs[:present.numel(), 0] = present + start
    pairs[:present.numel(), 1] = counts[present]
    return pairs


def npu_moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, *, scale: Optional[torch.Tensor] = None,
                            offset: Optional[torch.Tensor] = None, active_num: int = -1, expert_capacity: int = -1,
                            expert_num: int = -1, drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range: Sequence[int] = (), row_idx_type: int = 0,
                            x_dtype: Optional[int] = None):
    """MoE routing with an active expert range, optional dynamic int8 quant and token counts.

    Pairs whose expert lies in ``[start, end)`` are stably sorted by expert and gathered into
    ``expanded_x`` (dropless: the first ``min(active_num, N*K)`` of them, active_num <= 0 meaning
    all; drop-pad: ``expert_capacity`` slots per expert).  ``expanded_row_idx`` with row_idx_type
    0 is indexed by source pair ``n*K + k`` and holds its destination row or -1; with type 1 its
    first entries are the source pairs of the valid rows in order (-1 after them).
    """
    _check(x.dim() == 2, "the x shape support only 2d")
    _check(expert_idx.dim() == 2, "the expert_idx shape support only 2d")
    _check(x.size(0) == expert_idx.size(0), "the first dim of expert_idx and x should be the same")
    if active_expert_range:
        _check(len(active_expert_range) == 2, "active_expert_range is None or invalid. must be int[2]")
        _check(active_expert_range[1] > active_expert_range[0], "active_expert_range is invalid. must be increasing")
        _check(active_expert_range[0] >= 0 and active_expert_range[1] <= 10240,
               "active_expert_range must be within [0, 10240]")
        start, end = int(active_expert_range[0]), int(active_expert_range[1])
    else:
        _check(expert_num > 0, lambda: f"npu_moe_init_routing_v2: expert_num must be greater than 0 when "
                                       f"active_expert_range is empty, but got {expert_num}")
        start, end = 0, expert_num
    _check(drop_pad_mode in (0, 1), "drop_pad_mode is None or invalid. must be in [0, 1]")
    _check(expert_tokens_num_type in (0, 1, 2), "expert_tokens_num_type is None or invalid. must be in [0, 1, 2]")
    _check(row_idx_type in (0, 1), "row_idx_type is None or invalid. must be in [0, 1]")
    if quant_mode not in (-1, 1) or x_dtype is not None:
        raise _unsupported("npu_moe_init_routing_v2", f"quant_mode={quant_mode}, x_dtype={x_dtype}")
    n, h = x.shape
    k = expert_idx.size(1)
    sorted_experts, order = _sort_by_expert(expert_idx)
    in_range = (sorted_experts >= start) & (sorted_experts < end)
    experts, sources = sorted_experts[in_range], order[in_range]
    if drop_pad_mode == 1:
        offered = torch.bincount(experts - start, minlength=end - start)
        rank = torch.arange(experts.numel()) - (offered.cumsum(0) - offered)[experts - start]
        kept = rank < expert_capacity
        experts, sources = experts[kept], sources[kept]
        dest = (experts - start) * expert_capacity + rank[kept]
        out_rows = (expert_num, expert_capacity)
    else:
        limit = n * k if active_num <= 0 else min(active_num, n * k)
        experts, sources = experts[:limit], sources[:limit]
        dest = torch.arange(sources.numel())
        out_rows = (limit,)
    counts = torch.bincount(experts - start, minlength=end - start)
    rows = x.to(torch.float32)[sources // k]
    if quant_mode == 1:
        if scale is not None:
            rows = rows * (scale.to(torch.float32)[experts - start] if scale.size(0) > 1 else scale.to(torch.float32))
        rows, row_scale = _pertoken_int8(rows)
    else:
        row_scale = scale.to(torch.float32)[sources // k] if scale is not None else torch.zeros(sources.numel())
    flat_rows = math.prod(out_rows)
    expanded_x = torch.zeros(flat_rows, h, dtype=rows.dtype if quant_mode == 1 else x.dtype)
    expanded_x[dest] = rows.to(expanded_x.dtype)
    expanded_scale = torch.zeros(flat_rows, dtype=torch.float32)
    expanded_scale[dest] = row_scale
    expanded_row_idx = torch.full((n * k,), -1, dtype=torch.int64)
    if row_idx_type == 0:
        expanded_row_idx[sources] = dest
    else:
        expanded_row_idx[:sources.numel()] = sources
    return (expanded_x.reshape(*out_rows, h), expanded_row_idx.to(torch.int32),
            _token_counts_output(counts, start, expert_num, expert_tokens_num_type, expert_tokens_num_flag),
            expanded_scale)


def npu_moe_finalize_routing(expanded_permuted_rows: torch.Tensor, skip1: Optional[torch.Tensor],
                             skip2: Optional[torch.Tensor], bias: Optional[torch.Tensor], scales: Optional[torch.Tensor],
                             expanded_src_to_dst_row: torch.Tensor, export_for_source_row: Optional[torch.Tensor],
                             drop_pad_mode: Optional[int] = 0, k: Optional[int] = 1) -> torch.Tensor:
    """Un-permute expert outputs and combine them per token.

    ``out[i] = skip1[i] + skip2[i] + sum_k scales[i,k] * (rows[src_to_dst[pos(i,k)]] + bias[expert[i,k]])``
    with ``pos = i + k*N`` for drop_pad_mode 0/1 (column-major, npu_moe_init_routing) and
    ``i*K + k`` for 2/3 (row-major, npu_moe_init_routing_v2); modes 1/3 read an (E, C, H)
    input, and a destination of -1 (a dropped pair) contributes nothing.
    """
    mode = drop_pad_mode or 0
    _check(mode in (0, 1, 2, 3), lambda: f"npu_moe_finalize_routing: drop_pad_mode must be in [0, 3], but got {mode}")
    rows = expanded_permuted_rows.to(torch.float32)
    rows = rows.reshape(-1, rows.size(-1))
    n = scales.size(0) if scales is not None else expanded_src_to_dst_row.numel() // k
    top = scales.size(1) if scales is not None else k
    token, choice = torch.arange(n).unsqueeze(1), torch.arange(top).unsqueeze(0)
    positions = token + choice * n if mode in (0, 1) else token * top + choice
    dest = expanded_src_to_dst_row.to(torch.int64)[positions]
    valid = dest >= 0
    gathered = rows[dest.clamp(min=0)]
    if bias is not None:
        gathered = gathered + bias.to(torch.float32)[export_for_source_row.to(torch.int64)]
    weight = scales.to(torch.float32) if scales is not None else torch.ones(n, top)
    out = (gathered * (weight * valid).unsqueeze(-1)).sum(dim=1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.to(torch.float32)
    return out.to(expanded_permuted_rows.dtype)


# ----------------------------------------------------------------------------- compute_expert_tokens
def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: torch.Tensor, num_expert: int) -> torch.Tensor:
    """For each expert i, the end (exclusive) of its rows in the sorted expert list: the number of
    entries <= i (the kernel's binary search for the last row of expert i).  int32, (num_expert,)."""
    _check(0 < num_expert <= 2048,
           lambda: f"npu_moe_compute_expert_tokens: num_expert must be in (0, 2048], but got {num_expert}")
    experts = sorted_expert_for_source_row.to(torch.int64).reshape(-1)
    ends = torch.searchsorted(experts, torch.arange(num_expert), right=True)
    return ends.to(torch.int32)


def _compute_expert_tokens_meta(sorted_expert_for_source_row, num_expert):
    return sorted_expert_for_source_row.new_empty((num_expert,), dtype=torch.int32)


# ----------------------------------------------------------------------------- token permute / unpermute
def _permute_checks(tokens, indices) -> None:
    _check(tokens.dim() == 2,
           lambda: f"The dims of input tokens should be 2 dimensional, but got {tokens.dim()}-dimensional.")
    _check(indices.dim() in (1, 2),
           lambda: f"The dims of input indices should be 2 or 1 dimensional, but got {indices.dim()}-dimensional.")


def _permuted_rows(num_out_tokens: Optional[int], flat: int) -> int:
    """Rows kept: all for None/0, the first min(n, N*K) for n > 0, N*K + n for n < 0."""
    n = 0 if num_out_tokens is None else num_out_tokens
    return min(n, flat) if n > 0 else n + flat


def npu_moe_token_permute(tokens: torch.Tensor, indices: torch.Tensor, num_out_tokens: Optional[int] = None,
                          padded_mode: bool = False):
    """Replicate each token once per chosen expert and sort the copies by expert (stable).

    ``order = stable_argsort(indices.flatten())``; ``permuted = tokens[order // topK][:rows]``;
    ``sorted_indices[i]`` is where copy i (token i // topK) landed: ``permuted[sorted_indices[i]]
    = tokens[i // topK]`` (the inverse of ``order``, int32).
    """
    _permute_checks(tokens, indices)
    if padded_mode:
        raise _unsupported("npu_moe_token_permute", "padded_mode=True")
    top_k = indices.size(1) if indices.dim() == 2 else 1
    flat = indices.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    rows = _permuted_rows(num_out_tokens, flat.numel())
    permuted = tokens[order[:rows] // top_k]
    sorted_indices = torch.empty_like(order)
    sorted_indices[order] = torch.arange(order.numel())
    return permuted, sorted_indices.to(torch.int32)


def _token_permute_meta(tokens, indices, num_out_tokens=None, padded_mode=False):
    _permute_checks(tokens, indices)
    rows = _permuted_rows(num_out_tokens, indices.numel())
    return tokens.new_empty((rows, tokens.size(1))), tokens.new_empty((indices.numel(),), dtype=torch.int32)


def _unpermute_checks(permuted_tokens, sorted_indices, probs) -> None:
    if probs is not None:
        _check(probs.dim() == 2,
               lambda: f"The dims of input probs should be 2 dimensional, but got {probs.dim()}-dimensional.")
    _check(permuted_tokens.dim() == 2, lambda: f"The dims of input permuted_tokens should be 2 dimensional, but "
                                                   f"got {permuted_tokens.dim()}-dimensional.")
    _check(sorted_indices.dim() == 1, lambda: f"The dims of input sorted_indices should be 1 dimensional, but got "
                                                  f"{sorted_indices.dim()}-dimensional.")


def npu_moe_token_unpermute(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor,
                            probs: Optional[torch.Tensor] = None, padded_mode: bool = False,
                            restore_shape: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``out[t] = sum_k probs[t, k] * permuted_tokens[sorted_indices[t*topK + k]]`` (probs 1 when None,
    topK = probs.size(1) or 1).  Copies dropped by permute (index past the permuted rows) add 0."""
    _unpermute_checks(permuted_tokens, sorted_indices, probs)
    if padded_mode or restore_shape is not None:
        raise _unsupported("npu_moe_token_unpermute", "padded_mode / restore_shape")
    top_k = probs.size(1) if probs is not None else 1
    tokens = sorted_indices.size(0) // top_k
    index = sorted_indices.to(torch.int64)[:tokens * top_k].reshape(tokens, top_k)
    present = index < permuted_tokens.size(0)
    rows = permuted_tokens.to(torch.float32)[index.clamp(max=max(permuted_tokens.size(0) - 1, 0))]
    weight = probs.to(torch.float32) if probs is not None else torch.ones(tokens, 1)
    out = (rows * (weight * present).unsqueeze(-1)).sum(dim=1)
    return out.to(permuted_tokens.dtype)


def _token_unpermute_meta(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    _unpermute_checks(permuted_tokens, sorted_indices, probs)
    top_k = 1 if probs is None else probs.size(1)
    return permuted_tokens.new_empty((sorted_indices.size(0) // top_k, permuted_tokens.size(-1)))


SPECS = [
    OpSpec("npu_moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)",
           npu_moe_gating_top_k_softmax, vector()),
    OpSpec("npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, Tensor? input_ids=None, "
           "Tensor? tid2eid=None, int k_group=1, int group_count=1, int group_select_mode=0, int renorm=0, "
           "int norm_type=0, bool out_flag=False, float routed_scaling_factor=1.0, float eps=1e-20) "
           "-> (Tensor, Tensor, Tensor)", npu_moe_gating_top_k, vector()),
    OpSpec("npu_moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) "
           "-> (Tensor, Tensor, Tensor)", npu_moe_init_routing, vector()),
    OpSpec("npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, "
           "int active_num=-1, int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, "
           "int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, int quant_mode=-1, "
           "int[2] active_expert_range=[], int row_idx_type=0, int? x_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)",
           npu_moe_init_routing_v2, vector()),
    OpSpec("npu_moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, "
           "Tensor? scales, Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0, "
           "int? k=1) -> Tensor", npu_moe_finalize_routing, vector()),
    OpSpec("npu_moe_compute_expert_tokens(Tensor sorted_expert_for_source_row, int num_expert) -> Tensor",
           npu_moe_compute_expert_tokens, vector(), meta=_compute_expert_tokens_meta),
    OpSpec("npu_moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens=None, bool padded_mode=False) "
           "-> (Tensor, Tensor)", npu_moe_token_permute, vector(), meta=_token_permute_meta),
    OpSpec("npu_moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, "
           "bool padded_mode=False, int[]? restore_shape=None) -> Tensor",
           npu_moe_token_unpermute, vector(), meta=_token_unpermute_meta),
]
