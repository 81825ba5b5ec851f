"""MC2 fused compute + communication: MoE expert-parallel dispatch/combine (v1 and v2) and the TP
matmul collectives (npu_mm_all_reduce_base, npu_all_gather_base_mm, npu_mm_reduce_scatter_base).

Each op has a single-rank reference (a world of one rank), a meta shape rule following the wheel's
meta registration, and an MC2 profile (every vector core, held while it waits for its peers).  Across
ranks, inside ``npugraph.run_ranks``, the op's ``OpSpec.mc2`` kernel checks the call and hands it to
``collectives.mc2_issue``, which pairs it with the same op on every member of the HCCL communicator
named by ``hcom``/``group_ep``; once all issued, the op's ``OpSpec.mc2_math`` (``_dispatch_math``,
``_combine_math``, ...) computes every rank's outputs at once.  Formulas: torch_npu 2.14.0's
docstrings and the CANN aclnn docs (``allReduce(dequantScale * pertokenScale * (x1 @ x2 + bias) +
x3)``, ``ReduceScatter(x1 @ x2)``, ``AllGather(x1) @ x2``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ...errors import NotEmulated
from ._common import _check, _dtype_of, _pertoken_int8, _scale_values, _unsupported
from .quant import _per_k
from .spec import OpSpec, mc2


# ----------------------------------------------------------------------------- MC2 dispatch / combine
def _single_rank_only(op: str, ep_world_size: int, tp_world_size: int, shared_expert_rank_num: int):
    if ep_world_size != 1 or tp_world_size > 1 or shared_expert_rank_num != 0:
        raise _unsupported(op, f"ep_world_size={ep_world_size}, tp_world_size={tp_world_size}, "
                               f"shared_expert_rank_num={shared_expert_rank_num} (this is the single-rank reference; "
                               f"across ranks, call it on NPU tensors inside npugraph.run_ranks)")


def _dispatch_plan(expert_ids: torch.Tensor, active: torch.Tensor, moe_expert_num: int):
    """Where each (token, k) pair of this rank goes: (expert, slot among this rank's rows to that expert).

    Slots count earlier active tokens of the same rank routed to the same expert, which is what
    ``expand_idx`` reports and ``combine`` uses to find the row again.
    """
    experts = expert_ids.to(torch.int64)
    flat = experts.reshape(-1)
    sent = active.unsqueeze(1).expand_as(experts).reshape(-1)
    one_hot = F.one_hot(flat, moe_expert_num) * sent.unsqueeze(1)
    slots = (one_hot.cumsum(0) - one_hot).gather(1, flat.unsqueeze(1)).squeeze(1)
    return flat, slots, sent


def npu_moe_distribute_dispatch(x: torch.Tensor, expert_ids: torch.Tensor, group_ep: str, ep_world_size: int,
                                ep_rank_id: int, moe_expert_num: int, *, scales: Optional[torch.Tensor] = None,
                                x_active_mask: Optional[torch.Tensor] = None,
                                expert_scales: Optional[torch.Tensor] = None, group_tp: str = "",
                                tp_world_size: int = 0, tp_rank_id: int = 0, expert_shard_type: int = 0,
                                shared_expert_num: int = 1, shared_expert_rank_num: int = 0, quant_mode: int = 0,
                                global_bs: int = 0, expert_token_nums_type: int = 1):
    """MC2 expert-parallel dispatch, single-rank reference (ep_world_size 1, no shared-expert ranks).

    Outputs: (expand_x (A, H), dynamic_scales (A,) f32, expand_idx (N*K,) i32, expert_token_nums
    (local experts,) i64 [count, or cumsum for type 0], ep_recv_counts (W*local,) i32 [prefix sums in
    (local expert, source rank) order], tp_recv_counts (tp_world_size,) i32, expand_scales (A,) f32
    or (0,)).  expand_x holds the received rows grouped by local expert, then source rank, then
    token order; rows past the received ones are zero.  Quantisation (quant_mode 2, or smooth
    ``scales`` given) is dynamic per-row int8 of ``x * scales[expert]``.

    Multi-rank (``_dispatch_math`` below, reached for NPU tensors inside npugraph.run_ranks): each
    rank computes ``_dispatch_plan`` locally (destination rank = expert // local experts); the rows
    (and expert_scales) go to their destinations, every receiver lays them out by (local expert,
    source rank) and publishes the prefix sums as ep_recv_counts.  ``expand_idx`` stays a
    sender-local slot, so combine can find row ``ep_send_counts[e*W + r - 1] + slot`` on the owner
    of expert e and send it back.
    """
    op = "npu_moe_distribute_dispatch"
    _single_rank_only(op, ep_world_size, tp_world_size, shared_expert_rank_num)
    if quant_mode not in (0, 2):
        raise _unsupported(op, f"quant_mode={quant_mode}")
    n, h = x.shape
    k = expert_ids.size(1)
    local = moe_expert_num // ep_world_size
    rows_out = (global_bs or n * ep_world_size) * min(local, k)
    active = x_active_mask.to(torch.bool) if x_active_mask is not None else torch.ones(n, dtype=torch.bool)
    experts, slots, sent = _dispatch_plan(expert_ids, active, moe_expert_num)
    counts = torch.bincount(experts[sent], minlength=moe_expert_num)
    dest = (counts.cumsum(0) - counts)[experts] + slots
    dest, src = dest[sent], torch.arange(n * k)[sent]
    rows = x.to(torch.float32)[src // k]
    quantise = quant_mode == 2 or scales is not None
    dynamic_scales = torch.zeros(rows_out, dtype=torch.float32)
    if quantise:
        if scales is not None:
            rows = rows * scales.to(torch.float32)[experts[sent]]
        rows, dynamic_scales[dest] = _pertoken_int8(rows)
    expand_x = torch.zeros(rows_out, h, dtype=torch.int8 if quantise else x.dtype)
    expand_x[dest] = rows.to(expand_x.dtype)
    expand_scales = torch.zeros(rows_out if expert_scales is not None else 0, dtype=torch.float32)
    if expert_scales is not None:
        expand_scales[dest] = expert_scales.to(torch.float32).reshape(-1)[src]
    token_nums = counts.cumsum(0) if expert_token_nums_type == 0 else counts
    return (expand_x, dynamic_scales, slots.to(torch.int32), token_nums.to(torch.int64),
            counts.cumsum(0).to(torch.int32), torch.zeros(tp_world_size, dtype=torch.int32), expand_scales)


def npu_moe_distribute_combine(expand_x: torch.Tensor, expert_ids: torch.Tensor, expand_idx: torch.Tensor,
                               ep_send_counts: torch.Tensor, expert_scales: torch.Tensor, group_ep: str,
                               ep_world_size: int, ep_rank_id: int, moe_expert_num: int, *,
                               tp_send_counts: Optional[torch.Tensor] = None,
                               x_active_mask: Optional[torch.Tensor] = None,
                               activation_scale: Optional[torch.Tensor] = None,
                               weight_scale: Optional[torch.Tensor] = None, group_list: Optional[torch.Tensor] = None,
                               expand_scales: Optional[torch.Tensor] = None,
                               shared_expert_x: Optional[torch.Tensor] = None, group_tp: str = "",
                               tp_world_size: int = 0, tp_rank_id: int = 0, expert_shard_type: int = 0,
                               shared_expert_num: int = 1, shared_expert_rank_num: int = 0, global_bs: int = 0,
                               out_dtype: int = 0, comm_quant_mode: int = 0, group_list_type: int = 0) -> torch.Tensor:
    """MC2 inverse of dispatch, single-rank reference: ``out[n] = sum_k expert_scales[n,k] * row(n,k)``.

    ``row(n,k) = expand_x[ep_send_counts[e*W + r - 1] + expand_idx[n*K+k]]`` for e = expert_ids[n,k]
    (0 for the first segment), plus ``shared_expert_x[n]``; masked-out tokens give zero rows.
    Multi-rank (``_combine_math`` below): the owner of each segment sends it back
    to rank r (the reverse all-to-all of dispatch); the weighted sum then runs on rank r as here.
    """
    op = "npu_moe_distribute_combine"
    _single_rank_only(op, ep_world_size, tp_world_size, shared_expert_rank_num)
    if activation_scale is not None or weight_scale is not None or comm_quant_mode:
        raise _unsupported(op, "quantised combine (activation_scale / weight_scale / comm_quant_mode)")
    n, k = expert_ids.shape
    experts = expert_ids.to(torch.int64).reshape(-1)
    segment = experts * ep_world_size + ep_rank_id
    starts = torch.cat((torch.zeros(1, dtype=torch.int64), ep_send_counts.to(torch.int64)))[segment]
    rows = expand_x.to(torch.float32)[starts + expand_idx.to(torch.int64)].reshape(n, k, -1)
    out = (rows * expert_scales.to(torch.float32).unsqueeze(-1)).sum(dim=1)
    if shared_expert_x is not None:
        out = out + shared_expert_x.to(torch.float32)
    if x_active_mask is not None:
        out = out * x_active_mask.to(torch.float32).unsqueeze(-1)
    return out.to(expand_x.dtype)


# ----------------------------------------------------------------------------- across ranks
def _collectives():
    """The collectives package (its ``mc2`` module holds these ops' cross-rank glue)."""
    from .. import collectives
    return collectives


def _payload(t):
    return t._payload if hasattr(t, "_payload") else t


def _single_device(a: dict) -> bool:
    """A dispatch/combine of one rank: the single-rank reference computes it."""
    return a["ep_world_size"] <= 1 and a["tp_world_size"] <= 1


def _dispatch_math(calls):
    """Expert-parallel dispatch across ranks (v1 and v2): every rank plans its (token, k) rows locally
    (``_dispatch_plan``); rank d receives the rows for its experts d*L..(d+1)*L-1, laid out by
    (local expert, source rank, token order), and publishes the prefix sums of that layout as
    ``ep_recv_counts``, so combine can find row ``ep_send_counts[e_local*W + r - 1] + slot``."""
    c10d = _collectives()
    w = len(calls)
    c10d.c10d_math._agree(calls, "moe_expert_num / quant_mode / global_bs / hidden size / dtype",
                lambda c: (c.params["moe_expert_num"], c.params["quant_mode"], c.params["global_bs"],
                           c.params["x"].shape[1], c.params["x"].dtype, c.params["expert_ids"].shape[1]))
    first = calls[0].params
    experts_total, k = first["moe_expert_num"], first["expert_ids"].shape[1]
    local = experts_total // w
    plans = []
    for c in calls:
        a = c.params
        n = a["x"].shape[0]
        mask = a["x_active_mask"]
        active = mask.to(torch.bool) if mask is not None else torch.ones(n, dtype=torch.bool)
        experts, slots, sent = _dispatch_plan(a["expert_ids"], active, experts_total)
        rows = a["x"].to(torch.float32)[torch.arange(n * k) // k]
        if a["scales"] is not None:
            rows = rows * a["scales"].to(torch.float32)[experts]
        weights = (a["expert_scales"].to(torch.float32).reshape(-1) if a["expert_scales"] is not None
                   else None)
        plans.append((experts, slots, sent, rows, weights))
    for d, c in enumerate(calls):
        out = c.params["out"]
        received, weights, cum, per_expert = [], [], [], []
        for e_local in range(local):
            total = 0
            for experts, _, sent, rows, w_rows in plans:
                sel = (experts == d * local + e_local) & sent
                received.append(rows[sel])
                if w_rows is not None:
                    weights.append(w_rows[sel])
                total += int(sel.sum())
                cum.append((cum[-1] if cum else 0) + int(sel.sum()))
            per_expert.append(total)
        rows = torch.cat(received)
        capacity = out["expand_x"].shape[0]
        if rows.shape[0] > capacity:
            raise c10d.CollectiveError(f"rank {c.thread} receives {rows.shape[0]} rows but expand_x has {capacity} "
                                       f"(global_bs * min(local experts, k)); raise global_bs")
        if c.params["quantise"]:
            rows, out["dynamic_scales"][:rows.shape[0]] = _pertoken_int8(rows)
        out["expand_x"][:rows.shape[0]] = rows.to(out["expand_x"].dtype)
        if out["expand_scales"].numel():
            out["expand_scales"][:rows.shape[0]] = torch.cat(weights)
        counts = torch.tensor(per_expert, dtype=torch.int64)
        out["expert_token_nums"].copy_(counts.cumsum(0) if c.params["expert_token_nums_type"] == 0 else counts)
        out["ep_recv_counts"].copy_(torch.tensor(cum, dtype=torch.int32))
        out["expand_idx"].copy_(plans[d][1])


def _combine_math(calls):
    """The reverse all-to-all of dispatch plus the weighted sum over k, on each token's rank (v1 and v2):
    ``out[n] = sum_k expert_scales[n,k] * expand_x_d[ep_send_counts_d[e_local*W + r - 1] +
    expand_idx[n*K+k]]`` with d the owner of expert e (+ shared_expert_x, masked tokens 0)."""
    w = len(calls)
    _collectives().c10d_math._agree(calls, "moe_expert_num / hidden size / dtype",
                          lambda c: (c.params["moe_expert_num"], c.params["expand_x"].shape[1],
                                     c.params["expand_x"].dtype))
    local = calls[0].params["moe_expert_num"] // w
    starts = [torch.cat((torch.zeros(1, dtype=torch.int64), c.params["ep_send_counts"].to(torch.int64)))
              for c in calls]
    expand = [c.params["expand_x"].to(torch.float32) for c in calls]
    for r, c in enumerate(calls):
        a = c.params
        n, k = a["expert_ids"].shape
        experts = a["expert_ids"].to(torch.int64).reshape(-1)
        slots = a["expand_idx"].to(torch.int64).reshape(-1)
        mask = a["x_active_mask"]
        active = (mask.to(torch.bool) if mask is not None else torch.ones(n, dtype=torch.bool))
        active = active.unsqueeze(1).expand(n, k).reshape(-1)
        rows = torch.zeros(n * k, expand[0].shape[1])
        owners = experts // local
        for owner in range(w):
            sel = active & (owners == owner)
            index = starts[owner][(experts[sel] % local) * w + r] + slots[sel]
            rows[sel] = expand[owner][index]
        out = (rows.reshape(n, k, -1) * a["expert_scales"].to(torch.float32).unsqueeze(-1)).sum(1)
        if a["shared_expert_x"] is not None:
            out = out + a["shared_expert_x"].to(torch.float32)
        if mask is not None:
            out = out * mask.to(torch.float32).unsqueeze(-1)
        a["out"]["out"].copy_(out.to(a["out"]["out"].dtype))


def _dispatch_multi(name: str, a: dict):
    """Multi-rank dispatch (``OpSpec.mc2``): zeroed outputs shaped as the single-rank reference's
    (rows past the received ones stay 0), filled by ``_dispatch_math``."""
    if _single_device(a):
        return None
    _collectives().mc2.moe_group(name, a)
    world = a["ep_world_size"]
    p = {k: _payload(v) for k, v in a.items()}
    if p["quant_mode"] not in (0, 2):
        raise NotEmulated(f"{name}: quant_mode={p['quant_mode']} is not emulated")
    n, h = p["x"].shape
    k = p["expert_ids"].shape[1]
    local = p["moe_expert_num"] // world
    rows = (p["global_bs"] or n * world) * min(local, k)
    quantise = p["quant_mode"] == 2 or p["scales"] is not None
    outputs = {
        "expand_x": torch.zeros(rows, h, dtype=torch.int8 if quantise else p["x"].dtype),
        "dynamic_scales": torch.zeros(rows, dtype=torch.float32),
        "expand_idx": torch.zeros(n * k, dtype=torch.int32),
        "expert_token_nums": torch.zeros(local, dtype=torch.int64),
        "ep_recv_counts": torch.zeros(world * local, dtype=torch.int32),
        "tp_recv_counts": torch.zeros(p["tp_world_size"], dtype=torch.int32),
        "expand_scales": torch.zeros(rows if p["expert_scales"] is not None else 0, dtype=torch.float32),
    }
    return _collectives().mc2_issue(name, a["group_ep"], a, outputs, {"quantise": quantise})


def _combine_issue(name: str, a: dict, params: Optional[dict] = None) -> torch.Tensor:
    """Issue a multi-rank combine (v1 or v2) with its zeroed (tokens, hidden) output."""
    p = {k: _payload(v) for k, v in a.items()}
    out = torch.zeros(p["expert_ids"].shape[0], p["expand_x"].shape[1], dtype=p["expand_x"].dtype)
    (result,) = _collectives().mc2_issue(name, a["group_ep"], a, {"out": out}, params)
    return result


def _combine_multi(name: str, a: dict):
    """Multi-rank combine (``OpSpec.mc2``), computed by ``_combine_math``."""
    if _single_device(a):
        return None
    _collectives().mc2.moe_group(name, a)
    if a["activation_scale"] is not None or a["weight_scale"] is not None:
        raise NotEmulated(f"{name}: quantised combine (activation_scale / weight_scale) is not emulated")
    return _combine_issue(name, a)


_DISPATCH_V2 = "npu_moe_distribute_dispatch_v2"
_COMBINE_V2 = "npu_moe_distribute_combine_v2"


# ============================================================================ MoE dispatch / combine v2
def _dispatch_v2_sizes(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, tp_world_size,
                       shared_expert_num, shared_expert_rank_num, expert_shard_type, global_bs,
                       elastic_info, expert_scales) -> dict:
    """Output sizes of dispatch v2 (the wheel's meta rule, for Atlas A2/A3)."""
    _check(0 <= ep_rank_id < ep_world_size,
           lambda: f"ep_rank_id should be in [0, ep_world_size), but got ep_world_size={ep_world_size}, "
                       f"ep_rank_id={ep_rank_id}.")
    _check(0 <= shared_expert_rank_num < ep_world_size,
           lambda: f"shared_expert_rank_num should be in [0, ep_world_size), but got "
                       f"ep_world_size={ep_world_size}, shared_expert_rank_num={shared_expert_rank_num}.")
    default = shared_expert_num == 1 and shared_expert_rank_num == 0
    none = shared_expert_num == 0 and shared_expert_rank_num == 0
    valid = (shared_expert_num > 0 and shared_expert_rank_num // shared_expert_num > 0
             and shared_expert_rank_num % shared_expert_num == 0)
    _check(default or none or valid,
           lambda: f"shared expert setting invalid, got shared_expert_num={shared_expert_num}, "
                       f"shared_expert_rank_num={shared_expert_rank_num}.")
    bs, k = x.size(0), expert_ids.size(1)
    global_real = global_bs if global_bs else bs * ep_world_size
    moe_ranks = ep_world_size - shared_expert_rank_num
    local, rows = 1, 0
    if expert_shard_type == 0:
        if ep_rank_id < shared_expert_rank_num:
            per_shared = shared_expert_rank_num // shared_expert_num
            rows = global_real // ep_world_size * ((ep_world_size + per_shared - 1) // per_shared)
        else:
            local = moe_expert_num // moe_ranks
            rows = global_real * min(local, k)
        if elastic_info is not None:
            local = max(local, moe_expert_num // moe_ranks)
            if default or none:
                rows = global_real * min(local, k)
            else:
                per_shared = shared_expert_rank_num // shared_expert_num
                rows = max(global_real // ep_world_size * ((ep_world_size + per_shared - 1) // per_shared),
                           global_real * min(moe_expert_num // moe_ranks, k))
    recv = ep_world_size * local * (tp_world_size if tp_world_size == 2 else 1)
    if expert_scales is not None:
        recv = ep_world_size * local + global_real * 2 * k * (ep_world_size // 8)
    return {"rows": rows, "local": local, "recv": recv, "assist": max(bs * k, rows * 128),
            "expand_rows": max(rows, rows * tp_world_size)}


def _dispatch_v2_unmodelled(op, quant_mode, scales, x, elastic_info, zero_expert_num, copy_expert_num,
                            const_expert_num, y_dtype, x_dtype, scales_dtype) -> None:
    if quant_mode not in (0, 2):
        raise _unsupported(op, f"quant_mode={quant_mode}")
    if quant_mode == 0 and scales is not None:
        raise _unsupported(op, "static scales with quant_mode=0")
    if elastic_info is not None or zero_expert_num or copy_expert_num or const_expert_num:
        raise _unsupported(op, "elastic_info and zero/copy/const experts")
    if y_dtype is not None or x_dtype is not None or scales_dtype is not None:
        raise _unsupported(op, "y_dtype/x_dtype/scales_dtype")


def npu_moe_distribute_dispatch_v2(
        x: torch.Tensor, expert_ids: torch.Tensor, group_ep: str, ep_world_size: int, ep_rank_id: int,
        moe_expert_num: int, *, scales: Optional[torch.Tensor] = None, x_active_mask: Optional[torch.Tensor] = None,
        expert_scales: Optional[torch.Tensor] = None, elastic_info: Optional[torch.Tensor] = None,
        performance_info: Optional[torch.Tensor] = None, group_tp: str = "", tp_world_size: int = 0,
        tp_rank_id: int = 0, expert_shard_type: int = 0, shared_expert_num: int = 1, shared_expert_rank_num: int = 0,
        quant_mode: int = 0, global_bs: int = 0, expert_token_nums_type: int = 1, comm_alg: str = "",
        zero_expert_num: int = 0, copy_expert_num: int = 0, const_expert_num: int = 0, y_dtype: Optional[int] = None,
        x_dtype: Optional[int] = None, scales_dtype: Optional[int] = None):
    """Dispatch v2, single-rank reference: the v1 layout (``npu_moe_distribute_dispatch`` above)
    in v2's buffers.  ``assist_info_for_combine`` (the third output) holds the sender-local slot
    of each (token, k) pair in its first N*K entries; ``ep_recv_counts`` the prefix sums in its
    first W*local entries.  ``comm_alg`` and ``performance_info`` do not change the values."""
    sizes = _dispatch_v2_sizes(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, tp_world_size,
                               shared_expert_num, shared_expert_rank_num, expert_shard_type, global_bs,
                               elastic_info, expert_scales)
    _check(expert_token_nums_type in (0, 1), "the expert_token_nums_type should be 0 or 1")
    _dispatch_v2_unmodelled(_DISPATCH_V2, quant_mode, scales, x, elastic_info, zero_expert_num, copy_expert_num,
                            const_expert_num, y_dtype, x_dtype, scales_dtype)
    outs = npu_moe_distribute_dispatch(
        x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, scales=scales,
        x_active_mask=x_active_mask, expert_scales=expert_scales, group_tp=group_tp, tp_world_size=tp_world_size,
        tp_rank_id=tp_rank_id, expert_shard_type=expert_shard_type, shared_expert_num=shared_expert_num,
        shared_expert_rank_num=shared_expert_rank_num, quant_mode=quant_mode, global_bs=global_bs,
        expert_token_nums_type=expert_token_nums_type)
    expand_x, dynamic_scales, slots, token_nums, recv_counts, tp_recv, expand_scales = outs
    assist = torch.zeros(sizes["assist"], dtype=torch.int32)
    assist[:slots.numel()] = slots
    recv = torch.zeros(sizes["recv"], dtype=torch.int32)
    recv[:recv_counts.numel()] = recv_counts
    return expand_x, dynamic_scales, assist, token_nums, recv, tp_recv, expand_scales


def _dispatch_v2_meta(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None,
                      x_active_mask=None, expert_scales=None, elastic_info=None, performance_info=None, group_tp="",
                      tp_world_size=0, tp_rank_id=0, expert_shard_type=0, shared_expert_num=1,
                      shared_expert_rank_num=0, quant_mode=0, global_bs=0, expert_token_nums_type=1, comm_alg="",
                      zero_expert_num=0, copy_expert_num=0, const_expert_num=0, y_dtype=None, x_dtype=None,
                      scales_dtype=None):
    s = _dispatch_v2_sizes(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, tp_world_size,
                           shared_expert_num, shared_expert_rank_num, expert_shard_type, global_bs, elastic_info,
                           expert_scales)
    _check(expert_token_nums_type in (0, 1), "the expert_token_nums_type should be 0 or 1")
    out_dtype = x.dtype if quant_mode == 0 else torch.int8
    if y_dtype is not None:
        out_dtype = _dtype_of(y_dtype) or torch.uint8
    rows = s["rows"]
    if quant_mode == 0 and scales is not None:
        scale_shape = [rows] if x.dtype == torch.int32 else [rows, scales.size(1)]
    elif quant_mode == 3:
        scale_shape = [rows, -(-x.size(1) // 128)]
    else:
        scale_shape = [rows]
    if tp_world_size > 1:
        scale_shape = [rows * tp_world_size]
    scale_dtype = (scales.dtype if quant_mode == 0 and scales is not None and x.dtype not in (torch.float16,
                                                                                             torch.bfloat16)
                   else torch.float32)
    return (x.new_empty((s["expand_rows"], x.size(1)), dtype=out_dtype), x.new_empty(scale_shape, dtype=scale_dtype),
            x.new_empty((s["assist"],), dtype=torch.int32), x.new_empty((s["local"],), dtype=torch.int64),
            x.new_empty((s["recv"],), dtype=torch.int32), x.new_empty((tp_world_size,), dtype=torch.int32),
            x.new_empty((rows if expert_scales is not None else 0,), dtype=torch.float32))


def _combine_v2_unmodelled(op, elastic_info, ori_x, const_expert_alpha_1, const_expert_alpha_2, const_expert_v,
                           comm_quant_mode, zero_expert_num, copy_expert_num, const_expert_num) -> None:
    given = [n for n, v in (("elastic_info", elastic_info), ("ori_x", ori_x),
                            ("const_expert_alpha_1", const_expert_alpha_1),
                            ("const_expert_alpha_2", const_expert_alpha_2), ("const_expert_v", const_expert_v))
             if v is not None]
    if given or zero_expert_num or copy_expert_num or const_expert_num:
        raise _unsupported(op, "elastic_info, ori_x and zero/copy/const experts")
    if comm_quant_mode:
        raise _unsupported(op, f"comm_quant_mode={comm_quant_mode}")


def npu_moe_distribute_combine_v2(
        expand_x: torch.Tensor, expert_ids: torch.Tensor, assist_info_for_combine: torch.Tensor,
        ep_send_counts: torch.Tensor, expert_scales: torch.Tensor, group_ep: str, ep_world_size: int,
        ep_rank_id: int, moe_expert_num: int, *, tp_send_counts: Optional[torch.Tensor] = None,
        x_active_mask: Optional[torch.Tensor] = None, expand_scales: Optional[torch.Tensor] = None,
        shared_expert_x: Optional[torch.Tensor] = None, elastic_info: Optional[torch.Tensor] = None,
        ori_x: Optional[torch.Tensor] = None, const_expert_alpha_1: Optional[torch.Tensor] = None,
        const_expert_alpha_2: Optional[torch.Tensor] = None, const_expert_v: Optional[torch.Tensor] = None,
        performance_info: Optional[torch.Tensor] = None, group_tp: str = "", tp_world_size: int = 0,
        tp_rank_id: int = 0, expert_shard_type: int = 0, shared_expert_num: int = 1, shared_expert_rank_num: int = 0,
        global_bs: int = 0, comm_quant_mode: int = 0, comm_alg: str = "", zero_expert_num: int = 0,
        copy_expert_num: int = 0, const_expert_num: int = 0) -> torch.Tensor:
    """Combine v2, single-rank reference: ``npu_moe_distribute_combine`` above with the slots
    read from the first N*K entries of ``assist_info_for_combine``."""
    _combine_v2_unmodelled(_COMBINE_V2, elastic_info, ori_x, const_expert_alpha_1, const_expert_alpha_2,
                           const_expert_v, comm_quant_mode, zero_expert_num, copy_expert_num, const_expert_num)
    pairs = expert_ids.numel()
    return npu_moe_distribute_combine(
        expand_x, expert_ids, assist_info_for_combine.reshape(-1)[:pairs], ep_send_counts, expert_scales, group_ep,
        ep_world_size, ep_rank_id, moe_expert_num, tp_send_counts=tp_send_counts, x_active_mask=x_active_mask,
        expand_scales=expand_scales, shared_expert_x=shared_expert_x, group_tp=group_tp, tp_world_size=tp_world_size,
        tp_rank_id=tp_rank_id, expert_shard_type=expert_shard_type, shared_expert_num=shared_expert_num,
        shared_expert_rank_num=shared_expert_rank_num, global_bs=global_bs)


def _combine_v2_meta(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep,
                     ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None, x_active_mask=None,
                     expand_scales=None, shared_expert_x=None, elastic_info=None, ori_x=None,
                     const_expert_alpha_1=None, const_expert_alpha_2=None, const_expert_v=None, performance_info=None,
                     group_tp="", tp_world_size=0, tp_rank_id=0, expert_shard_type=0, shared_expert_num=1,
                     shared_expert_rank_num=0, global_bs=0, comm_quant_mode=0, comm_alg="", zero_expert_num=0,
                     copy_expert_num=0, const_expert_num=0):
    return expand_x.new_empty((expert_ids.size(0), expand_x.size(1)))


def _dispatch_v2_multi(name: str, a: dict):
    """Multi-rank dispatch v2: the v1 exchange (``_dispatch_math``) writing into v2's buffers."""
    if _single_device(a):
        return None
    _collectives().mc2.moe_group(name, a)
    world = a["ep_world_size"]
    p = {k: _payload(v) for k, v in a.items()}
    _dispatch_v2_unmodelled(name, p["quant_mode"], p["scales"], p["x"], p["elastic_info"], p["zero_expert_num"],
                            p["copy_expert_num"], p["const_expert_num"], p["y_dtype"], p["x_dtype"], p["scales_dtype"])
    metas = _dispatch_v2_meta(**{k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in p.items()})
    names = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
             "tp_recv_counts", "expand_scales")
    outputs = {n: torch.zeros(m.shape, dtype=m.dtype) for n, m in zip(names, metas)}
    n_pairs = p["expert_ids"].numel()
    local = p["moe_expert_num"] // world
    views = dict(outputs, expand_idx=outputs["assist_info_for_combine"][:n_pairs],
                 ep_recv_counts=outputs["ep_recv_counts"][:world * local])
    return _collectives().mc2_issue(name, a["group_ep"], a, outputs, {"out": views, "quantise": p["quant_mode"] == 2})


def _combine_v2_multi(name: str, a: dict):
    """Multi-rank combine v2: ``_combine_math`` with the slots read off ``assist_info_for_combine``."""
    if _single_device(a):
        return None
    _collectives().mc2.moe_group(name, a)
    p = {k: _payload(v) for k, v in a.items()}
    _combine_v2_unmodelled(name, p["elastic_info"], p["ori_x"], p["const_expert_alpha_1"], p["const_expert_alpha_2"],
                           p["const_expert_v"], p["comm_quant_mode"], p["zero_expert_num"], p["copy_expert_num"],
                           p["const_expert_num"])
    return _combine_issue(name, a, {"expand_idx": p["assist_info_for_combine"].reshape(-1)[:p["expert_ids"].numel()]})


# ============================================================================ TP matmul collectives
def _dequant_dtype(dequant_scale, y_dtype):
    if y_dtype is not None:
        return _dtype_of(y_dtype) or torch.float16
    return torch.bfloat16 if dequant_scale.dtype == torch.bfloat16 else torch.float16


def _mm_all_reduce_part(x1, x2, bias, antiquant_scale, antiquant_offset, x3, dequant_scale, pertoken_scale,
                        antiquant_group_size, y_dtype):
    """One rank's ``dequant * pertoken * (x1 @ x2 + bias) + x3`` in float64, and the output dtype."""
    rows = x1.reshape(-1, x1.size(-1))
    if x1.dtype == torch.int8:
        _check(dequant_scale is not None, "npu_mm_all_reduce_base: int8 x1 needs dequant_scale")
        y = rows.to(torch.float64) @ x2.to(torch.float64)
        if bias is not None:
            y = y + bias.to(torch.float64)
        y = y * _scale_values(dequant_scale).to(torch.float64).reshape(-1)
        if pertoken_scale is not None:
            y = y * pertoken_scale.to(torch.float64).reshape(-1, 1)
        dtype = _dequant_dtype(dequant_scale, y_dtype)
    else:
        w = x2.to(torch.float64)
        if antiquant_scale is not None:
            k = x2.size(0)
            if antiquant_offset is not None:
                w = w + _per_k(antiquant_offset, k, antiquant_group_size).to(torch.float64)
            w = w * _per_k(antiquant_scale, k, antiquant_group_size).to(torch.float64)
        y = rows.to(torch.float64) @ w
        if bias is not None:
            y = y + bias.to(torch.float64)
        dtype = x1.dtype
    if x3 is not None:
        y = y + x3.to(torch.float64).reshape(y.shape)
    return y.reshape(*x1.shape[:-1], -1), dtype


def _mm_all_reduce_checks(reduce_op, comm_quant_scale_1, comm_quant_scale_2, comm_quant_mode, group_sizes, x1_dtype,
                          x2_dtype, dequant_scale_dtype, pertoken_scale_dtype) -> None:
    _check(reduce_op == "sum", lambda: f"npu_mm_all_reduce_base: reduce_op only supports 'sum', but got "
                                           f"{reduce_op!r}")
    if comm_quant_scale_1 is not None or comm_quant_scale_2 is not None or comm_quant_mode:
        raise _unsupported("npu_mm_all_reduce_base", "quantised communication (comm_quant_scale / comm_quant_mode)")
    if any(v is not None for v in (group_sizes, x1_dtype, x2_dtype, dequant_scale_dtype, pertoken_scale_dtype)):
        raise _unsupported("npu_mm_all_reduce_base", "group_sizes / MX and fp8 dtype arguments")


def npu_mm_all_reduce_base(
        x1: torch.Tensor, x2: torch.Tensor, hcom: str, *, reduce_op: str = "sum", bias: Optional[torch.Tensor] = None,
        antiquant_scale: Optional[torch.Tensor] = None, antiquant_offset: Optional[torch.Tensor] = None,
        x3: Optional[torch.Tensor] = None, dequant_scale: Optional[torch.Tensor] = None,
        pertoken_scale: Optional[torch.Tensor] = None, comm_quant_scale_1: Optional[torch.Tensor] = None,
        comm_quant_scale_2: Optional[torch.Tensor] = None, antiquant_group_size: int = 0, comm_turn: int = 0,
        group_sizes: Optional[Sequence[int]] = None, y_dtype: Optional[int] = None, x1_dtype: Optional[int] = None,
        x2_dtype: Optional[int] = None, dequant_scale_dtype: Optional[int] = None,
        pertoken_scale_dtype: Optional[int] = None, comm_quant_mode: int = 0,
        comm_mode: Optional[str] = None) -> torch.Tensor:
    """Single-rank reference (a communicator of one rank): ``x1 @ x2`` with the same quant/antiquant
    forms as across ranks, where the result is the sum over ranks of
    ``dequant_scale * pertoken_scale * (x1_r @ x2_r + bias_r) + x3_r`` (bias and x3 per rank, as
    the CANN formula puts them inside the all-reduce)."""
    _mm_all_reduce_checks(reduce_op, comm_quant_scale_1, comm_quant_scale_2, comm_quant_mode, group_sizes, x1_dtype,
                          x2_dtype, dequant_scale_dtype, pertoken_scale_dtype)
    y, dtype = _mm_all_reduce_part(x1, x2, bias, antiquant_scale, antiquant_offset, x3, dequant_scale, pertoken_scale,
                                   antiquant_group_size, y_dtype)
    return y.to(dtype)


def _mm_all_reduce_meta(x1, x2, hcom, *, reduce_op="sum", bias=None, antiquant_scale=None, antiquant_offset=None,
                        x3=None, dequant_scale=None, pertoken_scale=None, comm_quant_scale_1=None,
                        comm_quant_scale_2=None, antiquant_group_size=0, comm_turn=0, group_sizes=None, y_dtype=None,
                        x1_dtype=None, x2_dtype=None, dequant_scale_dtype=None, pertoken_scale_dtype=None,
                        comm_quant_mode=0, comm_mode=None):
    shape = (*x1.shape[:-1], x2.size(1))
    if dequant_scale is not None:
        return x1.new_empty(shape, dtype=_dequant_dtype(dequant_scale, y_dtype))
    return x1.new_empty(shape)


def _mm_all_reduce_math(calls):
    parts = []
    for c in calls:
        a = c.params
        y, dtype = _mm_all_reduce_part(a["x1"], a["x2"], a["bias"], a["antiquant_scale"], a["antiquant_offset"],
                                       a["x3"], a["dequant_scale"], a["pertoken_scale"], a["antiquant_group_size"],
                                       a["y_dtype"])
        parts.append(y)
    shapes = {tuple(p.shape) for p in parts}
    if len(shapes) > 1:
        raise _collectives().CollectiveError(f"the ranks' matmul outputs differ in shape ({sorted(shapes)})")
    total = torch.stack(parts).sum(0)
    for c in calls:
        c.params["out"]["out"].copy_(total.to(c.params["out"]["out"].dtype))


def _mm_all_reduce_multi(name: str, a: dict):
    if not _collectives().mc2.inside_ranks():
        return None                      # one process without ranks: a communicator of one
    p = {k: _payload(v) for k, v in a.items()}
    _mm_all_reduce_checks(p["reduce_op"], p["comm_quant_scale_1"], p["comm_quant_scale_2"], p["comm_quant_mode"],
                          p["group_sizes"], p["x1_dtype"], p["x2_dtype"], p["dequant_scale_dtype"],
                          p["pertoken_scale_dtype"])
    _collectives().mc2.group(name, a, "hcom")
    meta = _mm_all_reduce_meta(**{k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in p.items()})
    out = torch.zeros(meta.shape, dtype=meta.dtype)
    (result,) = _collectives().mc2_issue(name, a["hcom"], a, {"out": out})
    return result


def _quant_mm(x1, x2, bias, x1_scale, x2_scale, output_dtype):
    """``x1 @ x2 (+ bias)``; with int8 operands ``* x1_scale (per row) * x2_scale (per column)``."""
    if x2_scale is None:
        y = x1.to(torch.float64) @ x2.to(torch.float64)
        if bias is not None:
            y = y + bias.to(torch.float64)
        return y, x1.dtype
    y = x1.to(torch.float64) @ x2.to(torch.float64)
    if bias is not None:
        y = y + bias.to(torch.float64)
    y = y * _scale_values(x2_scale).to(torch.float64).reshape(1, -1)
    if x1_scale is not None:
        y = y * x1_scale.to(torch.float64).reshape(-1, 1)
    return y, _mm_out_dtype(x1, x2_scale, output_dtype)


def _mm_out_dtype(x1, x2_scale, output_dtype):
    if x2_scale is None:
        return x1.dtype
    if x2_scale.dtype == torch.int64:
        return torch.float16
    return output_dtype if output_dtype is not None else torch.bfloat16


def _mm_common_checks(name, comm_turn) -> None:
    if comm_turn:
        raise _unsupported(name, f"comm_turn={comm_turn}")


_AGMM = "npu_all_gather_base_mm"


def npu_all_gather_base_mm(self: torch.Tensor, x2: torch.Tensor, hcom: str, world_size: int, *,
                           bias: Optional[torch.Tensor] = None, x1_scale: Optional[torch.Tensor] = None,
                           x2_scale: Optional[torch.Tensor] = None, gather_index: int = 0, gather_output: bool = True,
                           comm_turn: int = 0, output_dtype: Optional[torch.dtype] = None,
                           comm_mode: Optional[str] = None):
    """Single-rank reference (world_size 1): ``(x1 @ x2 (+bias) [* x1_scale * x2_scale], x1)``.
    Across W ranks the gathered ``x1`` is the ranks' x1 concatenated on dim 0 (rank order) and
    every rank multiplies it by its own x2; the second output is the gathered x1 (empty when
    ``gather_output`` is False)."""
    _agmm_checks(gather_index, comm_turn)
    if world_size > 1:
        raise _collectives().mc2.needs_ranks(_AGMM, world_size)
    y, dtype = _quant_mm(self, x2, bias, x1_scale, x2_scale, output_dtype)
    return y.to(dtype), (self.clone() if gather_output else torch.empty(0, dtype=self.dtype))


def _agmm_checks(gather_index, comm_turn) -> None:
    if gather_index != 0:
        raise _unsupported(_AGMM, f"gather_index={gather_index}")
    _mm_common_checks(_AGMM, comm_turn)


def _agmm_meta(self, x2, hcom, world_size, *, bias=None, x1_scale=None, x2_scale=None, gather_index=0,
               gather_output=True, comm_turn=0, output_dtype=None, comm_mode=None):
    world = world_size if world_size > 0 else 1
    rows = self.size(0) * world if gather_index == 0 else self.size(0)
    gathered = (self.size(0) * world, self.size(1)) if gather_index == 0 else (x2.size(0) * world, x2.size(1))
    dtype = _mm_out_dtype(self, x2_scale, output_dtype)
    return (self.new_empty((rows, x2.size(1)), dtype=dtype),
            self.new_empty(gathered if gather_output else (0,), dtype=self.dtype))


def _agmm_math(calls):
    gathered = torch.cat([c.params["self"] for c in calls])
    scales = [c.params["x1_scale"] for c in calls]
    x1_scale = torch.cat([s.reshape(-1, 1) for s in scales]) if all(s is not None for s in scales) else None
    for c in calls:
        a = c.params
        y, _ = _quant_mm(gathered, a["x2"], a["bias"], x1_scale, a["x2_scale"], a["output_dtype"])
        a["out"]["out"].copy_(y.to(a["out"]["out"].dtype))
        if a["out"]["gather_out"].numel():
            a["out"]["gather_out"].copy_(gathered)


def _check_world(name: str, a: dict) -> None:
    comm, me = _collectives().mc2.group(name, a, "hcom")
    if a["world_size"] != len(comm.members):
        raise RuntimeError(f"{name}: world_size={a['world_size']}, but {a['hcom']!r} has {len(comm.members)} ranks")


def _agmm_multi(name: str, a: dict):
    if a["world_size"] <= 1:
        return None
    if not _collectives().mc2.inside_ranks():
        raise _collectives().mc2.needs_ranks(name, a["world_size"])
    _agmm_checks(a["gather_index"], a["comm_turn"])
    _check_world(name, a)
    p = {k: _payload(v) for k, v in a.items()}
    out, gather = _agmm_meta(**{k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in p.items()})
    outputs = {"out": torch.zeros(out.shape, dtype=out.dtype), "gather_out": torch.zeros(gather.shape,
                                                                                         dtype=gather.dtype)}
    return _collectives().mc2_issue(name, a["hcom"], a, outputs)


_MMRS = "npu_mm_reduce_scatter_base"


def npu_mm_reduce_scatter_base(self: torch.Tensor, x2: torch.Tensor, hcom: str, world_size: int, *,
                               reduce_op: str = "sum", bias: Optional[torch.Tensor] = None,
                               x1_scale: Optional[torch.Tensor] = None, x2_scale: Optional[torch.Tensor] = None,
                               comm_turn: int = 0, output_dtype: Optional[torch.dtype] = None,
                               comm_mode: Optional[str] = None) -> torch.Tensor:
    """Single-rank reference (world_size 1): ``x1 @ x2 (+bias) [* x1_scale * x2_scale]``.  Across W
    ranks every rank computes its partial product, the partials are summed and rank r keeps
    rows ``[r*M/W, (r+1)*M/W)`` of the sum (M must divide by W)."""
    _mmrs_checks(reduce_op, comm_turn)
    if world_size > 1:
        raise _collectives().mc2.needs_ranks(_MMRS, world_size)
    y, dtype = _quant_mm(self, x2, bias, x1_scale, x2_scale, output_dtype)
    return y.to(dtype)


def _mmrs_checks(reduce_op, comm_turn) -> None:
    _check(reduce_op == "sum", lambda: f"{_MMRS}: reduce_op only supports 'sum', but got {reduce_op!r}")
    _mm_common_checks(_MMRS, comm_turn)


def _mmrs_meta(self, x2, hcom, world_size, *, reduce_op="sum", bias=None, x1_scale=None, x2_scale=None, comm_turn=0,
               output_dtype=None, comm_mode=None):
    world = world_size if world_size > 0 else 1
    return self.new_empty((self.size(0) // world, x2.size(1)), dtype=_mm_out_dtype(self, x2_scale, output_dtype))


def _mmrs_math(calls):
    w = len(calls)
    parts = []
    for c in calls:
        a = c.params
        y, _ = _quant_mm(a["self"], a["x2"], a["bias"], a["x1_scale"], a["x2_scale"], a["output_dtype"])
        parts.append(y)
    shapes = {tuple(p.shape) for p in parts}
    if len(shapes) > 1:
        raise _collectives().CollectiveError(f"the ranks' matmul outputs differ in shape ({sorted(shapes)})")
    total = torch.stack(parts).sum(0)
    for r, chunk in enumerate(total.chunk(w)):
        out = calls[r].params["out"]["out"]
        out.copy_(chunk.to(out.dtype))


def _mmrs_multi(name: str, a: dict):
    if a["world_size"] <= 1:
        return None
    if not _collectives().mc2.inside_ranks():
        raise _collectives().mc2.needs_ranks(name, a["world_size"])
    _mmrs_checks(a["reduce_op"], a["comm_turn"])
    _check_world(name, a)
    rows = a["self"].shape[0]
    if rows % a["world_size"]:
        raise RuntimeError(f"{name}: the m axis of x1 ({rows}) must divide by world_size={a['world_size']}")
    p = {k: _payload(v) for k, v in a.items()}
    meta = _mmrs_meta(**{k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in p.items()})
    out = torch.zeros(meta.shape, dtype=meta.dtype)
    (result,) = _collectives().mc2_issue(name, a["hcom"], a, {"out": out})
    return result


SPECS = [
    OpSpec("npu_moe_distribute_dispatch(Tensor x, Tensor expert_ids, str group_ep, int ep_world_size, "
           "int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, Tensor? x_active_mask=None, "
           "Tensor? expert_scales=None, str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, "
           "int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, int quant_mode=0, "
           "int global_bs=0, int expert_token_nums_type=1) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", npu_moe_distribute_dispatch, mc2(),
           mc2=_dispatch_multi, mc2_math=_dispatch_math),
    OpSpec("npu_moe_distribute_combine(Tensor expand_x, Tensor expert_ids, Tensor expand_idx, "
           "Tensor ep_send_counts, Tensor expert_scales, str group_ep, int ep_world_size, int ep_rank_id, "
           "int moe_expert_num, *, Tensor? tp_send_counts=None, Tensor? x_active_mask=None, "
           "Tensor? activation_scale=None, Tensor? weight_scale=None, Tensor? group_list=None, "
           "Tensor? expand_scales=None, Tensor? shared_expert_x=None, str group_tp=\"\", int tp_world_size=0, "
           "int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, "
           "int global_bs=0, int out_dtype=0, int comm_quant_mode=0, int group_list_type=0) -> Tensor",
           npu_moe_distribute_combine, mc2(), mc2=_combine_multi, mc2_math=_combine_math),
    OpSpec("npu_moe_distribute_dispatch_v2(Tensor x, Tensor expert_ids, str group_ep, int ep_world_size, "
           "int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, Tensor? x_active_mask=None, "
           "Tensor? expert_scales=None, Tensor? elastic_info=None, Tensor? performance_info=None, str group_tp=\"\", "
           "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
           "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, int expert_token_nums_type=1, "
           "str comm_alg=\"\", int zero_expert_num=0, int copy_expert_num=0, int const_expert_num=0, "
           "int? y_dtype=None, int? x_dtype=None, int? scales_dtype=None) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
           npu_moe_distribute_dispatch_v2, mc2(), meta=_dispatch_v2_meta, mc2=_dispatch_v2_multi,
           mc2_math=_dispatch_math),
    OpSpec("npu_moe_distribute_combine_v2(Tensor expand_x, Tensor expert_ids, Tensor assist_info_for_combine, "
           "Tensor ep_send_counts, Tensor expert_scales, str group_ep, int ep_world_size, int ep_rank_id, "
           "int moe_expert_num, *, Tensor? tp_send_counts=None, Tensor? x_active_mask=None, "
           "Tensor? expand_scales=None, Tensor? shared_expert_x=None, Tensor? elastic_info=None, Tensor? ori_x=None, "
           "Tensor? const_expert_alpha_1=None, Tensor? const_expert_alpha_2=None, Tensor? const_expert_v=None, "
           "Tensor? performance_info=None, str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, "
           "int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
           "int comm_quant_mode=0, str comm_alg=\"\", int zero_expert_num=0, int copy_expert_num=0, "
           "int const_expert_num=0) -> Tensor",
           npu_moe_distribute_combine_v2, mc2(), meta=_combine_v2_meta, mc2=_combine_v2_multi,
           mc2_math=_combine_math),
    OpSpec("npu_mm_all_reduce_base(Tensor x1, Tensor x2, str hcom, *, str reduce_op='sum', Tensor? bias=None, "
           "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? x3=None, Tensor? dequant_scale=None, "
           "Tensor? pertoken_scale=None, Tensor? comm_quant_scale_1=None, Tensor? comm_quant_scale_2=None, "
           "int antiquant_group_size=0, int comm_turn=0, int[]? group_sizes=None, int? y_dtype=None, "
           "int? x1_dtype=None, int? x2_dtype=None, int? dequant_scale_dtype=None, int? pertoken_scale_dtype=None, "
           "int comm_quant_mode=0, str? comm_mode=None) -> Tensor",
           npu_mm_all_reduce_base, mc2(), meta=_mm_all_reduce_meta, mc2=_mm_all_reduce_multi,
           mc2_math=_mm_all_reduce_math),
    OpSpec("npu_all_gather_base_mm(Tensor self, Tensor x2, str hcom, int world_size, *, Tensor? bias=None, "
           "Tensor? x1_scale=None, Tensor? x2_scale=None, int gather_index=0, bool gather_output=True, "
           "int comm_turn=0, ScalarType? output_dtype=None, str? comm_mode=None) -> (Tensor, Tensor)",
           npu_all_gather_base_mm, mc2(), meta=_agmm_meta, mc2=_agmm_multi, mc2_math=_agmm_math),
    OpSpec("npu_mm_reduce_scatter_base(Tensor self, Tensor x2, str hcom, int world_size, *, str reduce_op='sum', "
           "Tensor? bias=None, Tensor? x1_scale=None, Tensor? x2_scale=None, int comm_turn=0, "
           "ScalarType? output_dtype=None, str? comm_mode=None) -> Tensor",
           npu_mm_reduce_scatter_base, mc2(), meta=_mmrs_meta, mc2=_mmrs_multi, mc2_math=_mmrs_math),
]
