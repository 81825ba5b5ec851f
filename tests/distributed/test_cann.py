"""The CANN release decides what HCCL does: seed 000 on the default chip by HCCL_OP_EXPANSION_MODE=AIV
and stream limits alone, the one-AIV-communicator rule, CANN 9's refusal of a limit below an AIV
algorithm's minimum, and the setting itself (marker, get_cann_version).

Why: seed 000 says HCCL ops in AIV mode honour core limits.  With CANN 8.5.0's AIV table an A2
reduce-scatter runs on the vector cores its stream's limit leaves (16), the MoE dispatch/combine on
its stream's 24, and an unlimited NonZero wants all 48: the two cards can deadlock, as the seed
describes, without any profile from a hook.  Without AIV the reduce-scatter is orchestrated on the
host and holds no core, so no cycle can form (the limit on its stream is then only misleading).
"""
import pytest
import torch
import torch.distributed as dist

import torch_npu
from pytest_npugraph import cann
from pytest_npugraph.runtime import hccl_modes
from pytest_npugraph.trace import Kernel

from .test_seed import check_results, copied_inputs, seed_rank as seed_rank_with

pytestmark = [pytest.mark.npu_devices(2), pytest.mark.npu_chip("Ascend910B1"),
              pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning")]


def seed_rank(rank, nonzero_limit=None, device_inputs=copied_inputs):
    """Seed 000 with its core figures as stream limits: TP 16, EP 24, NonZero unlimited (or the fix)."""
    return seed_rank_with(rank, nonzero_limit, (16, 24), device_inputs)


def core_use(npugraph):
    return {(k.op, k.cores.vector, k.vector_limit) for k in npugraph.trace.records if isinstance(k, Kernel)
            and (k.collective or k.op == "aten::nonzero")}


def test_seed000_deadlock_on_the_default_chip_in_aiv_mode_with_stream_limits(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    assert npugraph.chip == "Ascend910B1"
    # one report: the oversubscription is the deadlock's cause line
    with npugraph.expect("deadlock", match=r"npu:0, npu:1 can block each other forever(.|\n)*"
                                           r"cause: 3 ops on npu:0, npu:1 may run at the same time and need 88 "
                                           r"vector cores together, but the device has 48(.|\n)*"
                                           r"fix: limit aten::nonzero .* to 8 vector cores"):
        check_results(npugraph.run_ranks(seed_rank))
    assert ("hccl::reduce_scatter", 48, 16) in core_use(npugraph)      # all vector cores, limited to 16
    npugraph.assert_clean()


def test_seed000_fix_in_aiv_mode_is_clean_and_correct(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    check_results(npugraph.run_ranks(seed_rank, 8))
    npugraph.assert_clean()


def test_seed000_without_aiv_cannot_deadlock_and_says_the_limit_is_only_misleading(npugraph, monkeypatch):
    monkeypatch.delenv("HCCL_OP_EXPANSION_MODE", raising=False)
    with npugraph.expect("core-limit", match="need 72 vector cores together"):     # MC2 24 + NonZero 48
        with npugraph.expect("limit-ineffective", match="hccl::reduce_scatter.*AI_CPU or HOST expansion mode"):
            check_results(npugraph.run_ranks(seed_rank))
    assert [h for h in npugraph.hazards if h.kind == "deadlock"] == []
    assert ("hccl::reduce_scatter", 0, 16) in core_use(npugraph)


@pytest.mark.npu_cann("8.0.0")
def test_seed000_on_cann_8_0_keeps_reduce_scatter_out_of_aiv(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    with npugraph.expect("core-limit"), npugraph.expect("limit-ineffective"):
        check_results(npugraph.run_ranks(seed_rank))
    assert [h for h in npugraph.hazards if h.kind == "deadlock"] == []


# ------------------------------------------------------------------ one AIV communicator
def two_aiv_communicators(rank, second_in_aiv=True):
    options = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    options.hccl_config = {"hccl_op_expansion_mode": 3 if second_in_aiv else 1}
    dist.init_process_group("hccl", rank=rank, world_size=2)
    tp = dist.new_group([0, 1])
    ep = dist.new_group([0, 1], pg_options=options)
    a, b = torch.ones(4, device="npu"), torch.ones(4, device="npu") * 2
    dist.all_reduce(a, group=tp)
    dist.all_reduce(b, group=ep)
    return a.cpu().tolist(), b.cpu().tolist()


def test_a_second_communicator_in_aiv_mode_warns_with_hccls_restriction(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    with pytest.warns(hccl_modes.HcclAivWarning, match=r"communicators 'hccl/1' and 'hccl/2' both run collectives "
                                                        r"in AIV mode .*does not support several communicators"):
        assert npugraph.run_ranks(two_aiv_communicators) == [([2.0] * 4, [4.0] * 4)] * 2


def test_one_communicator_in_aiv_mode_does_not_warn(npugraph, recwarn):
    options_only_for_ep = npugraph.run_ranks(two_aiv_communicators)    # env unset: tp HOST, ep AIV
    assert options_only_for_ep == [([2.0] * 4, [4.0] * 4)] * 2
    assert not [w for w in recwarn if issubclass(w.category, hccl_modes.HcclAivWarning)]
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
        npugraph.run_ranks(two_aiv_communicators, False)               # tp AIV, ep HOST by its option
    assert not [w for w in recwarn if issubclass(w.category, hccl_modes.HcclAivWarning)]


# ------------------------------------------------------------------- CANN 9: the minimum
def limited_all_reduce(rank, limit):
    dist.init_process_group("hccl", rank=rank, world_size=2)
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, vector_num=limit)
    t = torch.ones(4, device="npu")
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        dist.all_reduce(t)
    torch.npu.current_stream().wait_stream(s)
    return t.cpu().tolist()


@pytest.mark.npu_cann("9.0.0")
def test_cann_9_refuses_an_aiv_limit_below_the_algorithms_minimum(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    with pytest.raises(RuntimeError, match=r"HCCL all_reduce in AIV mode: the stream's vector core limit 1 is below "
                                           r"the 2 vector cores its algorithm needs for 2 ranks \(CANN 9.0.0"):
        npugraph.run_ranks(limited_all_reduce, 1)


@pytest.mark.npu_cann("9.0.0")
def test_cann_9_takes_a_limit_at_the_minimum(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    assert npugraph.run_ranks(limited_all_reduce, 2) == [[2.0] * 4] * 2
    npugraph.assert_clean()


def test_cann_8_5_takes_any_limit(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    assert npugraph.run_ranks(limited_all_reduce, 1) == [[2.0] * 4] * 2
    npugraph.assert_clean()


@pytest.mark.npu_cann("9.0.0")
def test_cann_9_outside_aiv_mode_refuses_nothing(npugraph):
    assert npugraph.run_ranks(limited_all_reduce, 1) == [[2.0] * 4] * 2


# ----------------------------------------------------------------------- the setting
@pytest.mark.npu_cann("9.0.0")
def test_marker_sets_what_torch_npu_reports(npugraph):
    assert torch_npu.npu.utils.get_cann_version() == "9.0.0" and torch.npu.utils._is_gte_cann_version("9.0.0")


def test_default_is_8_5_0(npugraph):
    assert torch_npu.npu.utils.get_cann_version() == "8.5.0" == cann.DEFAULT
    assert not torch_npu.npu.utils._is_gte_cann_version("9.0.0")


def _gated():
    from torch_npu.testing.common_utils import SkipIfNotGteCANNVersion

    @SkipIfNotGteCANNVersion("9.0.0")
    def needs_9(self):
        return "ran"
    return needs_9


@pytest.mark.npu_cann("9.0.0")
def test_skip_if_not_gte_cann_version_runs_on_the_emulated_release():
    """torch_npu.testing's decorator (torch_npu's test_coalesced_manager) asks the emulated CANN version."""
    assert _gated()(None) == "ran"


def test_skip_if_not_gte_cann_version_skips_below_it_naming_the_release():
    import unittest

    with pytest.raises(unittest.SkipTest, match=r"Only run on 9\.0\.0 or greater, current cann version is 8\.5\.0\."):
        _gated()(None)
