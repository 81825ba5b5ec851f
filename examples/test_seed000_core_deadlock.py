"""Seed 000: the multi-stream core-occupation deadlock across two cards, and its fix.

Each card runs three streams at once: a tensor-parallel reduce-scatter (16 of the 48 vector cores),
an expert-parallel MoE dispatch/combine (24) and a NonZero that must hold all 48 vector cores at
once.  If card 0's NonZero grabs the cores its dispatch/combine needs while card 1's NonZero grabs
those of its reduce-scatter, each card's collective waits for its peer forever: on hardware the job
hangs until the HCCL timeout.  The seed's fix limits the blocking op's stream to the cores the
collectives leave free: 48 - 16 - 24 = 8.  The collective core figures come from conftest.py.
"""
import pytest
import torch
import torch.distributed as dist
import torch_npu

pytestmark = [pytest.mark.npu_devices(2), pytest.mark.npu_chip("Ascend910B1"),
              pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")]
TOKENS, HIDDEN, EXPERTS = 4, 8, 4


def rank_inputs(rank):
    g = torch.Generator().manual_seed(rank)
    grads = torch.arange(8.0) * (rank + 1)
    x = torch.randn(TOKENS, HIDDEN, generator=g)
    expert_ids = torch.tensor([[(n + rank) % EXPERTS, (n + rank + 1) % EXPERTS] for n in range(TOKENS)],
                              dtype=torch.int32)
    scales = torch.rand(TOKENS, 2, generator=g)
    padding = torch.arange(12) % 3 == rank
    return grads, x, expert_ids, scales, padding


def moe_step(rank, nonzero_limit=None):
    """One rank's step: the three overlapped streams of the seed."""
    dist.init_process_group("hccl", rank=rank, world_size=2)
    tp, ep = dist.new_group([0, 1]), dist.new_group([0, 1])
    ep_name = ep._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
    grads, x, expert_ids, scales, padding = (t.npu() for t in rank_inputs(rank))
    main = torch.npu.current_stream()
    tp_stream, ep_stream, mask_stream = torch.npu.Stream(), torch.npu.Stream(), torch.npu.Stream()
    if nonzero_limit:
        torch.npu.set_stream_limit(mask_stream, vector_num=nonzero_limit)     # the seed's fix
    for s in (tp_stream, ep_stream, mask_stream):
        s.wait_stream(main)
    with torch.npu.stream(tp_stream):
        shard = torch.empty(4, device="npu")
        dist.reduce_scatter_tensor(shard, grads, group=tp)
    with torch.npu.stream(ep_stream):
        expand_x, _, expand_idx, _, recv_counts, _, _ = torch_npu.npu_moe_distribute_dispatch(
            x, expert_ids, ep_name, 2, rank, EXPERTS, expert_scales=scales)
        moe_out = torch_npu.npu_moe_distribute_combine(expand_x, expert_ids, expand_idx, recv_counts, scales,
                                                       ep_name, 2, rank, EXPERTS)   # identity experts
    with torch.npu.stream(mask_stream):
        kept = torch.nonzero(padding)                # NonZero: all 48 vector cores at once
    for s in (tp_stream, ep_stream, mask_stream):
        main.wait_stream(s)
    return shard.cpu(), moe_out.cpu(), kept.cpu()


def test_unlimited_nonzero_beside_two_collectives_deadlocks_the_cards(npugraph):
    # one report: the oversubscription (88 of 48 vector cores on each card) is the deadlock's cause
    with npugraph.expect("deadlock", match=r"npu:0, npu:1 can block each other forever(.|\n)*"
                                           r"cause: 3 ops on npu:0, npu:1 may run at the same time and need 88 "
                                           r"vector cores together, but the device has 48(.|\n)*"
                                           r"fix: limit aten::nonzero .* to 8 vector cores"):
        npugraph.run_ranks(moe_step)


def test_nonzero_limited_to_the_free_cores_is_clean_and_correct(npugraph):
    results = npugraph.run_ranks(moe_step, 8)
    for rank, (shard, moe_out, kept) in enumerate(results):
        torch.testing.assert_close(shard, (torch.arange(8.0) * 3)[4 * rank:4 * rank + 4])   # sum of both ranks
        _, x, _, scales, padding = rank_inputs(rank)
        torch.testing.assert_close(moe_out, x * scales.sum(1, keepdim=True))
        assert kept.flatten().tolist() == torch.nonzero(padding).flatten().tolist()
    npugraph.assert_clean()
