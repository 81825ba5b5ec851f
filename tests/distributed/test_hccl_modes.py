"""HCCL op expansion modes decide which cores a collective holds; run_ranks' default group.

Why: only an AIV-mode collective occupies vector cores (and can starve a NonZero or another
collective); in the chips' default modes (HOST on A2, AI_CPU on A3) two collectives overlapping on
two streams hold none, so the deadlock/core-limit analyses must stay silent there.
"""
import pytest
import torch
import torch.distributed as dist

import torch_npu
from pytest_npugraph.runtime import hccl_modes
from pytest_npugraph.trace import Kernel

pytestmark = [pytest.mark.npu_devices(2),
              pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning")]


def collectives(npugraph, device=0):
    return {k.op: k.cores for k in npugraph.trace.records if isinstance(k, Kernel) and k.collective
            and npugraph.trace.streams[k.stream].device == device}


def two_stream_collectives(rank, pg_options=None):
    """An all-reduce and an all-to-all on two streams that may overlap, and a NonZero on a third."""
    dist.init_process_group("hccl", rank=rank, world_size=2, pg_options=pg_options)
    x = torch.ones(4, device="npu") * (rank + 1)
    y = torch.arange(4.0, device="npu")
    main, a, b, c = torch.npu.current_stream(), torch.npu.Stream(), torch.npu.Stream(), torch.npu.Stream()
    for s in (a, b, c):
        s.wait_stream(main)
    with torch.npu.stream(a):
        dist.all_reduce(x)
    with torch.npu.stream(b):
        out = torch.empty_like(y)
        dist.all_to_all_single(out, y)
    with torch.npu.stream(c):
        kept = torch.nonzero(torch.arange(6, device="npu") % 2)
    for s in (a, b, c):
        main.wait_stream(s)
    return x.cpu(), out.cpu(), kept.cpu()


def test_default_mode_per_chip_family():
    assert hccl_modes.default_mode("Ascend910B1") == "HOST"
    assert hccl_modes.default_mode("Ascend910_9392") == "AI_CPU"
    assert hccl_modes.communicator_mode("Ascend910B1", {}, {"HCCL_OP_EXPANSION_MODE": "aiv"}) == "AIV"
    assert hccl_modes.communicator_mode("Ascend910B1", {}, {"HCCL_OP_EXPANSION_MODE": "FAST"}) == "HOST"
    assert hccl_modes.communicator_mode("Ascend910B1", {"hccl_op_expansion_mode": 2},
                                        {"HCCL_OP_EXPANSION_MODE": "AIV"}) == "AI_CPU"   # the option wins
    assert hccl_modes.communicator_mode("Ascend910B1", {"hccl_op_expansion_mode": 0},
                                        {"HCCL_OP_EXPANSION_MODE": "AIV"}) == "AIV"      # 0 = default
    with pytest.raises(RuntimeError, match="Value type of hccl_op_expansion_mode should be int."):
        hccl_modes.config_mode({"hccl_op_expansion_mode": "AIV"})


def test_default_host_mode_collectives_hold_no_cores_and_stay_silent(npugraph):
    results = npugraph.run_ranks(two_stream_collectives)
    assert results[0][0].tolist() == [3.0] * 4
    cores = collectives(npugraph)
    assert cores["hccl::all_reduce"].vector == 0 and cores["hccl::all_to_all"].vector == 0
    npugraph.assert_clean()


@pytest.mark.npu_chip("Ascend910_9392")
def test_a3_default_is_ai_cpu_where_limits_do_not_apply(npugraph):
    npugraph.run_ranks(two_stream_collectives)
    cores = collectives(npugraph)
    assert cores["hccl::all_reduce"].kind == "HCCL" and not cores["hccl::all_reduce"].limit_applies
    npugraph.assert_clean()


def test_aiv_mode_from_the_environment_holds_all_vector_cores(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    with npugraph.expect("deadlock", match="cause: 3 ops on npu:0, npu:1 .* need 144 vector cores together"):   # all-core collectives + NonZero
        npugraph.run_ranks(two_stream_collectives)
    cores = collectives(npugraph)
    assert cores["hccl::all_reduce"].vector == npugraph.vector_cores and cores["hccl::all_reduce"].all_resident


def test_aiv_mode_from_the_process_group_options(npugraph):
    options = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    options.hccl_config = {"hccl_op_expansion_mode": 3}
    with npugraph.expect("deadlock", match="cause: 3 ops on npu:0, npu:1 .* need 144 vector cores together"):
        npugraph.run_ranks(two_stream_collectives, options)
    assert collectives(npugraph)["hccl::all_reduce"].vector == npugraph.vector_cores


def gather_and_scatter(rank):
    dist.init_process_group("hccl", rank=rank, world_size=2)
    out = torch.empty(8, device="npu")
    dist.all_gather_into_tensor(out, torch.ones(4, device="npu"))
    got = torch.empty(4, device="npu")
    dist.scatter(got, [torch.ones(4, device="npu")] * 2 if rank == 0 else None, src=0)
    return out.cpu(), got.cpu()


@pytest.mark.npu_cann("8.0.0")
def test_aiv_applies_only_to_the_ops_hccl_documents(npugraph, monkeypatch):
    """CANN 8.0.0 documents AIV on A2 for AllReduce and AlltoAll(V) only: AllGather stays in HOST mode.
    (Until this session the emulator held this list for every release; 8.5.0 adds AllGather.)"""
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    npugraph.run_ranks(gather_and_scatter)
    cores = collectives(npugraph)
    assert cores["hccl::all_gather"].vector == 0 and cores["hccl::scatter"].vector == 0


def test_cann_8_5_runs_allgather_in_aiv_but_never_scatter(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    npugraph.run_ranks(gather_and_scatter)
    cores = collectives(npugraph)
    assert cores["hccl::all_gather"].vector == npugraph.vector_cores and cores["hccl::all_gather"].all_resident
    assert cores["hccl::scatter"].vector == 0          # Scatter is in no release's AIV list for A2


@pytest.mark.parametrize("mode", hccl_modes.MODES)
def test_mc2_ops_use_vector_cores_in_every_mode(npugraph, mode):
    from pytest_npugraph.runtime.collectives import op_cores

    device = npugraph.runtime.devices[0]
    cores = op_cores("npu::npu_moe_distribute_dispatch", device, mode)
    assert (cores.kind, cores.vector, cores.all_resident) == ("MC2", npugraph.vector_cores, True)


def test_the_hook_overrides_the_mode(npugraph, op_profiles):
    op_profiles["all_reduce"] = {"kind": "HCCL", "vector": 16, "all_resident": True}
    with npugraph.expect("core-limit", match="need 64 vector cores together"):    # 16 + NonZero's 48
        npugraph.run_ranks(two_stream_collectives)
    assert collectives(npugraph)["hccl::all_reduce"].vector == 16


# ------------------------------------------------------------------- default group
def test_rank_function_without_init_process_group_gets_the_default_hccl_group(npugraph):
    def rank_fn(rank):
        t = torch.ones(2, device="npu") * (rank + 1)
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), dist.get_backend(), t.cpu().tolist()

    assert npugraph.run_ranks(rank_fn) == [(0, 2, "hccl", [3.0, 3.0]), (1, 2, "hccl", [3.0, 3.0])]


def test_both_styles_in_one_test_and_is_initialized_guard(npugraph):
    def explicit(rank):
        if not dist.is_initialized():
            dist.init_process_group("hccl", rank=rank, world_size=2)
        t = torch.ones(1, device="npu")
        dist.all_reduce(t)
        return t.cpu().item()

    def implicit(rank):
        group = dist.new_group([0, 1])           # new_group needs the default group: made on demand
        t = torch.ones(1, device="npu")
        dist.all_reduce(t, group=group)
        return t.cpu().item()

    assert npugraph.run_ranks(explicit) == [2.0, 2.0]
    assert npugraph.run_ranks(implicit) == [2.0, 2.0]
