"""Seed 000 written the seed's way: each card reaches its two collectives in its own order.

Card 0 launches the tensor-parallel reduce-scatter first and the expert-parallel dispatch/combine
second; card 1 the other way round (two communicators, each collective on a stream of its own, a
NonZero on a third).  HCCL launches return at once, so nothing waits on the host: the hazard is on
the devices.  The reduce-scatter holds 16 of the 48 vector cores, dispatch/combine 24 (their
AIV/MC2 profiles come from conftest.py), and an unlimited NonZero wants all 48 at once: card 0's
NonZero can take the cores its dispatch/combine needs while card 1's takes those of its
reduce-scatter, and each card's collective then waits for its peer for ever.  The seed's fix
limits NonZero's stream to the 48 - 16 - 24 = 8 cores the collectives leave free.

The rank function does not call ``init_process_group``: ``run_ranks`` gives each rank the default
``hccl`` group (world size = the emulated devices), as a launcher would.
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
    tp, ep = dist.new_group([0, 1]), dist.new_group([0, 1])      # two communicators
    ep_name = ep._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
    grads, x, expert_ids, scales, padding = (t.npu() for t in rank_inputs(rank))
    main = torch.npu.current_stream()
    tp_stream, ep_stream, mask_stream = torch.npu.Stream(), torch.npu.Stream(), torch.npu.Stream()
    if nonzero_limit:
        torch.npu.set_stream_limit(mask_stream, vector_num=nonzero_limit)     # the seed's fix
    for s in (tp_stream, ep_stream, mask_stream):
        s.wait_stream(main)
    out = {}

    def reduce_scatter():
        with torch.npu.stream(tp_stream):
            out["shard"] = torch.empty(4, device="npu")
            dist.reduce_scatter_tensor(out["shard"], grads, group=tp)

    def dispatch_combine():
        with torch.npu.stream(ep_stream):
            expand_x, _, expand_idx, _, recv_counts, _, _ = torch_npu.npu_moe_distribute_dispatch(
                x, expert_ids, ep_name, 2, rank, EXPERTS, expert_scales=scales)
            out["moe"] = torch_npu.npu_moe_distribute_combine(expand_x, expert_ids, expand_idx, recv_counts,
                                                              scales, ep_name, 2, rank, EXPERTS)

    for launch in ((reduce_scatter, dispatch_combine) if rank == 0 else (dispatch_combine, reduce_scatter)):
        launch()                                     # card 0: TP first; card 1: EP first
    with torch.npu.stream(mask_stream):
        kept = torch.nonzero(padding)                # NonZero: all 48 vector cores at once
    for s in (tp_stream, ep_stream, mask_stream):
        main.wait_stream(s)
    return out["shard"].cpu(), out["moe"].cpu(), kept.cpu()


def test_cards_reaching_the_collectives_in_different_orders_deadlock_without_the_limit(npugraph):
    # one report: the oversubscription (88 of 48 vector cores on each card) is the deadlock's cause
    with npugraph.expect("deadlock", match=r"npu:0, npu:1 can block each other forever(.|\n)*"
                                           r"cause: 3 ops on npu:0, npu:1 may run at the same time and need 88 "
                                           r"vector cores together, but the device has 48(.|\n)*"
                                           r"fix: limit aten::nonzero .* to 8 vector cores"):
        npugraph.run_ranks(moe_step)


def test_with_the_limit_the_same_orders_are_clean_and_correct(npugraph):
    results = npugraph.run_ranks(moe_step, 8)
    for rank, (shard, moe_out, kept) in enumerate(results):
        torch.testing.assert_close(shard, (torch.arange(8.0) * 3)[4 * rank:4 * rank + 4])   # sum of both ranks
        _, x, _, scales, padding = rank_inputs(rank)
        torch.testing.assert_close(moe_out, x * scales.sum(1, keepdim=True))
        assert kept.flatten().tolist() == torch.nonzero(padding).flatten().tolist()
    npugraph.assert_clean()


@pytest.mark.npu_chip("Ascend910_9391")
@pytest.mark.npu_allow("deadlock", "core-limit")
def test_on_an_a3_chip_in_aiv_mode_one_bug_is_one_report(npugraph, monkeypatch):
    """The seed on an A3 card with HCCL in AIV mode (as the seed's cluster ran it): one deadlock report,
    its cause (the oversubscription on both cards) inside it, not a core-limit report per card and op."""
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    npugraph.run_ranks(moe_step)
    assert npugraph.chip == "Ascend910_9391"
    assert [h.kind for h in npugraph.hazards] == ["deadlock"]
    (deadlock,) = npugraph.hazards
    assert "cause: 3 ops on npu:0, npu:1 may run at the same time and need 88 vector cores" in deadlock.message
    assert "fix: limit aten::nonzero" in deadlock.message
