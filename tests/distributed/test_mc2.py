"""MC2 expert parallelism across ranks: npu_moe_distribute_dispatch / combine on the group's
HCCL communicator (``group_ep`` from ``get_hccl_comm_name``).

Why: the MoE layer of an LLM sends each token to the ranks owning its top-k experts and
gathers the weighted expert outputs back; the round trip through dispatch, the experts'
grouped matmul and combine must equal the MoE computed locally, on every rank.
"""
import pytest
import torch
import torch.distributed as dist

import torch_npu
from pytest_npugraph.trace import Kernel

WORLDS = [pytest.param(n, marks=pytest.mark.npu_devices(n), id=f"{n}ranks") for n in (2, 4)]
TOKENS, HIDDEN, TOP_K, LOCAL_EXPERTS = 6, 8, 2, 2


def routing(rank, experts, tokens=TOKENS):
    """Rank-specific tokens, distinct top-k experts per token, and gate weights."""
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, HIDDEN, generator=g)
    ids = torch.stack([torch.randperm(experts, generator=g)[:TOP_K] for _ in range(tokens)]).to(torch.int32)
    scales = torch.rand(tokens, TOP_K, generator=g)
    return x, ids, scales


def expert_weights(experts):
    return torch.randn(experts, HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(99)) / HIDDEN


def local_moe(x, ids, scales, weights, mask=None):
    """out[n] = sum_k scales[n,k] * x[n] @ W[ids[n,k]] (masked tokens: 0)."""
    out = torch.stack([sum(scales[n, k] * x[n] @ weights[ids[n, k]] for k in range(TOP_K))
                       for n in range(x.shape[0])])
    return out if mask is None else out * mask.unsqueeze(-1)


def comm_name(rank):
    return dist.group.WORLD._get_backend(torch.device("npu")).get_hccl_comm_name(rank)


def moe_layer(rank, world, mask=None, quant_mode=0):
    """What model code runs on each rank: dispatch, this rank's experts, combine."""
    experts = world * LOCAL_EXPERTS
    dist.init_process_group("hccl", rank=rank, world_size=world)
    x, ids, scales = routing(rank, experts)
    group_ep = comm_name(rank)
    expand_x, dynamic_scales, expand_idx, token_nums, recv_counts, _, expand_scales = \
        torch_npu.npu_moe_distribute_dispatch(
            x.npu(), ids.npu(), group_ep, world, rank, experts, expert_scales=scales.npu(),
            x_active_mask=None if mask is None else mask.npu(), quant_mode=quant_mode)
    if quant_mode:
        expand_x = expand_x.to(torch.float32) * dynamic_scales.unsqueeze(-1)
    mine = expert_weights(experts)[rank * LOCAL_EXPERTS:(rank + 1) * LOCAL_EXPERTS].npu()
    (expert_out,) = torch_npu.npu_grouped_matmul([expand_x], [mine], group_list=token_nums, group_type=0,
                                                 group_list_type=1, split_item=2)
    out = torch_npu.npu_moe_distribute_combine(
        expert_out, ids.npu(), expand_idx, recv_counts, scales.npu(), group_ep, world, rank, experts,
        x_active_mask=None if mask is None else mask.npu())
    return out.cpu(), token_nums.cpu(), recv_counts.cpu()


@pytest.mark.parametrize("world", WORLDS)
def test_dispatch_experts_combine_round_trip_equals_the_local_moe(npugraph, world):
    experts = world * LOCAL_EXPERTS
    results = npugraph.run_ranks(moe_layer, world)
    routes = [routing(r, experts) for r in range(world)]
    weights = expert_weights(experts)
    for rank, (out, token_nums, recv_counts) in enumerate(results):
        torch.testing.assert_close(out, local_moe(*routes[rank], weights), rtol=1e-4, atol=1e-5)
        # rows per (local expert, source rank), as the counts dispatch publishes
        per_source = torch.tensor([[int((ids == rank * LOCAL_EXPERTS + j).sum()) for _, ids, _ in routes]
                                   for j in range(LOCAL_EXPERTS)])
        assert token_nums.tolist() == per_source.sum(1).tolist()
        assert recv_counts.tolist() == per_source.reshape(-1).cumsum(0).tolist()


@pytest.mark.npu_devices(2)
def test_masked_tokens_are_not_sent_and_combine_to_zero(npugraph):
    mask = torch.tensor([True, False, True, True, False, True])
    results = npugraph.run_ranks(moe_layer, 2, mask)
    weights = expert_weights(4)
    for rank, (out, token_nums, _) in enumerate(results):
        torch.testing.assert_close(out, local_moe(*routing(rank, 4), weights, mask.float()), rtol=1e-4, atol=1e-5)
    sent = sum(int(mask.sum()) * TOP_K for _ in range(2))
    assert sum(int(t.sum()) for _, t, _ in results) == sent


@pytest.mark.npu_devices(2)
def test_int8_dispatch_dequantises_to_the_local_moe(npugraph):
    results = npugraph.run_ranks(moe_layer, 2, None, 2)
    weights = expert_weights(4)
    for rank, (out, _, _) in enumerate(results):
        torch.testing.assert_close(out, local_moe(*routing(rank, 4), weights), rtol=0.05, atol=0.05)


@pytest.mark.npu_devices(2)
def test_dispatch_and_combine_are_recorded_as_collectives_of_the_ep_communicator(npugraph):
    npugraph.run_ranks(moe_layer, 2)
    trace = npugraph.trace
    mc2 = [r for r in trace.records if isinstance(r, Kernel) and r.op.startswith("npu::npu_moe_distribute")]
    assert sorted((trace.streams[k.stream].device, k.op.split("_")[-1], k.collective) for k in mc2) == [
        (0, "combine", ("hccl/0", 1)), (0, "dispatch", ("hccl/0", 0)),
        (1, "combine", ("hccl/0", 1)), (1, "dispatch", ("hccl/0", 0))]
    for k in mc2:
        assert (k.cores.kind, k.cores.all_resident, k.cores.vector) == ("MC2", True, npugraph.vector_cores)
        assert k.reads and k.writes and k.site.path.endswith("test_mc2.py")


@pytest.mark.npu_devices(2)
def test_group_ep_must_name_the_ranks_communicator(npugraph):
    def fn(rank, group_ep, ep_rank_id):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        x, ids, _ = routing(rank, 4)
        torch_npu.npu_moe_distribute_dispatch(x.npu(), ids.npu(), group_ep or comm_name(rank), 2,
                                              rank if ep_rank_id is None else ep_rank_id, 4)

    with pytest.raises(RuntimeError, match=r"group_ep='hcom_x' is not an HCCL communicator of this rank; get it "
                                           r"with pg._get_backend\(torch.device\('npu'\)\).get_hccl_comm_name"):
        npugraph.run_ranks(fn, "hcom_x", None)
    with npugraph.expect("deadlock", match="never issues it"):   # rank 0's dispatch has no peer
        with pytest.raises(RuntimeError, match=r"ep_rank_id=0, but 'hccl/0@2' has 2 ranks and this is rank 1"):
            npugraph.run_ranks(fn, None, 0)


def test_multi_rank_dispatch_outside_run_ranks_says_how(npugraph):
    x, ids, _ = routing(0, 4)
    with pytest.raises(RuntimeError, match=r"ep_world_size=2 needs 2 ranks: run the rank function with "
                                           r"npugraph.run_ranks"):
        torch_npu.npu_moe_distribute_dispatch(x.npu(), ids.npu(), "hccl/0", 2, 0, 4)
