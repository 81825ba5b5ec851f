"""Seed 000 as model code: on two cards, a reduce-scatter (16 vector cores), an MoE
dispatch/combine (24) and a NonZero (all 48 at once) on three streams each.

Why: the cards can each let NonZero take the cores the other card's collective needs, and
then wait on each other forever.  The run itself completes on the CPU; the trace it leaves
(device pools, per-rank streams in program order, collectives keyed across cards, the
profiles from the users' hook) is what lets the deadlock analysis find the hang before
hardware does, and the seed's fix (limit NonZero's stream to 48 - 16 - 24 = 8 vector cores)
must leave it clean with the same, correct results.
"""
import pytest
import torch
import torch.distributed as dist

import torch_npu
from pytest_npugraph.trace import DeviceCores, GroupCreated, Kernel

pytestmark = [pytest.mark.npu_devices(2), pytest.mark.npu_chip("Ascend910B1"),
              pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning")]
TOKENS, HIDDEN, EXPERTS = 4, 8, 4


def inputs(rank):
    g = torch.Generator().manual_seed(rank)
    grads = torch.arange(8.0) * (rank + 1)
    x = torch.randn(TOKENS, HIDDEN, generator=g)
    ids = torch.tensor([[(n + rank) % EXPERTS, (n + rank + 1) % EXPERTS] for n in range(TOKENS)], dtype=torch.int32)
    scales = torch.rand(TOKENS, 2, generator=g)
    mask = torch.arange(12) % 3 == rank
    return grads, x, ids, scales, mask


def copied_inputs(rank):
    """``inputs(rank)`` copied to the rank's device with ``.npu()``."""
    return tuple(t.npu() for t in inputs(rank))


def seed_rank(rank, nonzero_limit=None, stream_limits=(None, None), device_inputs=copied_inputs):
    """Seed 000 on one rank: a reduce-scatter (TP), MoE dispatch/combine (EP) and a NonZero on three
    streams.  ``stream_limits`` are the vector limits of the TP and EP streams (none: the op profiles
    decide), ``nonzero_limit`` the NonZero stream's (the seed's fix); ``device_inputs(rank)`` puts
    ``inputs(rank)`` on the device once the communicators exist."""
    dist.init_process_group("hccl", rank=rank, world_size=2)
    tp, ep = dist.new_group([0, 1]), dist.new_group([0, 1])
    group_ep = ep._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
    grads, x, ids, scales, mask = device_inputs(rank)
    main = torch.npu.current_stream()
    rs_stream, moe_stream, nz_stream = torch.npu.Stream(), torch.npu.Stream(), torch.npu.Stream()
    for stream, limit in zip((rs_stream, moe_stream), stream_limits):
        if limit:
            torch.npu.set_stream_limit(stream, vector_num=limit)
    if nonzero_limit:
        torch.npu.set_stream_limit(nz_stream, vector_num=nonzero_limit)
    for s in (rs_stream, moe_stream, nz_stream):
        s.wait_stream(main)
    with torch.npu.stream(rs_stream):
        shard = torch.empty(4, device="npu")
        dist.reduce_scatter_tensor(shard, grads, group=tp)
    with torch.npu.stream(moe_stream):
        expand_x, _, expand_idx, _, recv_counts, _, _ = torch_npu.npu_moe_distribute_dispatch(
            x, ids, group_ep, 2, rank, EXPERTS, expert_scales=scales)
        moe = torch_npu.npu_moe_distribute_combine(expand_x, ids, expand_idx, recv_counts, scales, group_ep, 2,
                                                   rank, EXPERTS)      # identity experts
    with torch.npu.stream(nz_stream):
        picked = torch.nonzero(mask)
    for s in (rs_stream, moe_stream, nz_stream):
        main.wait_stream(s)
    return shard.cpu(), moe.cpu(), picked.cpu()


@pytest.fixture
def seed_profiles(op_profiles):
    """The seed's core figures, as a suite would state them in its conftest.py."""
    op_profiles["reduce_scatter"] = {"kind": "HCCL", "vector": 16, "all_resident": True}
    for op in ("npu_moe_distribute_dispatch", "npu_moe_distribute_combine"):
        op_profiles[op] = {"kind": "MC2", "vector": 24, "all_resident": True}
    return op_profiles


def check_results(results):
    for rank, (shard, moe, picked) in enumerate(results):
        torch.testing.assert_close(shard, (torch.arange(8.0) * 3)[4 * rank:4 * rank + 4])
        _, x, _, scales, mask = inputs(rank)
        torch.testing.assert_close(moe, x * scales.sum(1, keepdim=True))
        assert picked.flatten().tolist() == torch.nonzero(mask).flatten().tolist()


def test_seed_trace_holds_what_the_deadlock_analysis_needs(npugraph, seed_profiles):
    with npugraph.expect("deadlock", match="cause: 3 ops on npu:0, npu:1 may run at the same time"):
        check_results(npugraph.run_ranks(seed_rank))
    trace = npugraph.trace
    devices = [(r.device, r.cube, r.vector) for r in trace.records if isinstance(r, DeviceCores)]
    assert devices == [(0, npugraph.cube_cores, 48), (1, npugraph.cube_cores, 48)]
    groups = {(r.group, r.devices) for r in trace.records if isinstance(r, GroupCreated)}
    assert groups == {("hccl/0", (0, 1)), ("hccl/1", (0, 1)), ("hccl/2", (0, 1))}
    for device in (0, 1):
        ops = [k for k in trace.records if isinstance(k, Kernel) and trace.streams[k.stream].device == device and
               (k.collective or "nonzero" in k.op)]
        streams = {k.op: trace.streams[k.stream].label for k in ops}
        assert [(k.op, k.collective, k.cores.vector, k.cores.all_resident) for k in ops] == [
            ("hccl::reduce_scatter", ("hccl/1", 0), 16, True),
            ("npu::npu_moe_distribute_dispatch", ("hccl/2", 0), 24, True),
            ("npu::npu_moe_distribute_combine", ("hccl/2", 1), 24, True),
            ("aten::nonzero", None, 48, True)]
        assert len({streams["hccl::reduce_scatter"], streams["npu::npu_moe_distribute_dispatch"],
                    streams["aten::nonzero"]}) == 3
        assert streams["npu::npu_moe_distribute_dispatch"] == streams["npu::npu_moe_distribute_combine"]
        assert all(k.site.path.endswith("test_seed.py") for k in ops)


def test_seed_without_a_limit_is_reported_as_a_deadlock_naming_both_cards(npugraph, seed_profiles):
    with npugraph.expect("deadlock", match=r"streams on npu:0, npu:1 can block each other forever(.|\n)*"
                                           r"cause: 3 ops on npu:0, npu:1 may run at the same time and need 88 vector "
                                           r"cores together(.|\n)*"
                                           r"fix: limit aten::nonzero on npu:\d/stream-\d+ \(tests/distributed/"
                                           r"test_seed.py:\d+\) to 8 vector cores"):
        npugraph.run_ranks(seed_rank)


def test_seed_fix_limiting_nonzeros_stream_is_clean_and_correct(npugraph, seed_profiles):
    check_results(npugraph.run_ranks(seed_rank, 8))
    npugraph.assert_clean()
    limits = {k.vector_limit for k in npugraph.trace.records if isinstance(k, Kernel) and k.op == "aten::nonzero"}
    assert limits == {8}
