"""MC2 expert-parallel dispatch/combine (the single-rank math; run_ranks exchanges rows across ranks)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._common import _pertoken_int8, _unsupported
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

    Multi-rank (runtime/collectives.py ``_dispatch``, reached for NPU tensors inside
    npugraph.run_ranks): each rank computes ``_dispatch_plan`` locally (destination rank =
    expert // local experts); the rows (and expert_scales) go to their destinations, every
    receiver lays them out by (local expert, source rank) and publishes the prefix sums as
    ep_recv_counts.  ``expand_idx`` stays a sender-local slot, so combine
    can find row ``ep_send_counts[e*W + r - 1] + slot`` on the owner of expert e and send it back.
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
    Multi-rank (runtime/collectives.py ``_combine``): the owner of each segment sends it back
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


SPECS = [
    OpSpec("npu_moe_distribute_dispatch(Tensor x, Tensor expert_ids, str group_ep, int ep_world_size, "
           "int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, Tensor? x_active_mask=None, "
           "Tensor? expert_scales=None, str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, "
           "int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, int quant_mode=0, "
           "int global_bs=0, int expert_token_nums_type=1) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", npu_moe_distribute_dispatch, mc2()),
    OpSpec("npu_moe_distribute_combine(Tensor expand_x, Tensor expert_ids, Tensor expand_idx, "
           "Tensor ep_send_counts, Tensor expert_scales, str group_ep, int ep_world_size, int ep_rank_id, "
           "int moe_expert_num, *, Tensor? tp_send_counts=None, Tensor? x_active_mask=None, "
           "Tensor? activation_scale=None, Tensor? weight_scale=None, Tensor? group_list=None, "
           "Tensor? expand_scales=None, Tensor? shared_expert_x=None, str group_tp=\"\", int tp_world_size=0, "
           "int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, "
           "int global_bs=0, int out_dtype=0, int comm_quant_mode=0, int group_list_type=0) -> Tensor",
           npu_moe_distribute_combine, mc2()),
]
