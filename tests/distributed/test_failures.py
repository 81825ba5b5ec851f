"""run_ranks never hangs and never leaks: mismatched, abandoned and circular collectives end
with an error naming ranks, ops and lines; a rank's exception reaches the test; the process
group state is gone afterwards.

Why: on hardware each of these hangs until the HCCL timeout (or exchanges the wrong
buffers); a test suite must fail fast, at the user's line, and leave the next test clean.
"""
import contextlib
import os
import re
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import torch_npu  # noqa: F401
from pytest_npugraph import trace as T
from pytest_npugraph.runtime.collectives import CollectiveError
from pytest_npugraph.runtime.executor import DeviceHang

pytestmark = pytest.mark.npu_devices(2)


def line_of(text: str) -> int:
    """The line of this file containing ``text`` (so messages can be checked for user lines)."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "line_of" not in line)


def run_failing(npugraph, fn, error=CollectiveError, hazard=None, by_state=True):
    """Run the ranks, expecting ``error`` and, when the ranks recorded a collective some peer never
    matches, the analysis' ``deadlock`` hazard (matching ``hazard``) too.  Detection is by state,
    not by timeout (``by_state``): the only clock-based end of a job (the stall timeout, "no progress
    for N s") must not be what ended it.  That is what a wall-clock bound used to check, and load
    stretched it past its 5 s."""
    with npugraph.expect("deadlock", match=hazard) if hazard else contextlib.nullcontext():
        with pytest.raises(error) as info:
            npugraph.run_ranks(fn)
    assert ("no progress for" in str(info.value)) is not by_state
    return info.value


def test_one_communicators_collectives_in_different_orders_hang_the_device_not_the_test(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        t = torch.ones(4, device="npu")
        if rank == 0:
            dist.all_reduce(t)              # order-A
            dist.broadcast(t, src=0)
        else:
            dist.broadcast(t, src=0)        # order-B
            dist.all_reduce(t)
        return t.cpu()                      # the host waits: for ever on hardware

    message = str(run_failing(npugraph, fn, DeviceHang, hazard="not the same op on every rank"))
    assert message.startswith("device hang: every rank is blocked or finished (rank 0 the host (read sync")
    assert "collective #0 of communicator 'hccl/0' is not the same op on every rank: " \
           f"rank 0 issued all_reduce at tests/distributed/test_failures.py:{line_of('# order-A')}; " \
           f"rank 1 issued broadcast at tests/distributed/test_failures.py:{line_of('# order-B')}" in message


def test_expect_deadlock_absorbs_the_hang(npugraph):
    def fn(rank):
        t = torch.ones(4, device="npu")
        (dist.all_reduce if rank == 0 else dist.barrier)(*((t,) if rank == 0 else ()))
        return t.cpu()

    with npugraph.expect("deadlock", match="not the same op on every rank"):
        npugraph.run_ranks(fn)                 # raises DeviceHang, absorbed with its hazard
    x = torch.ones(2, device="npu") + 1        # the test goes on: the hung work was dropped
    assert x.cpu().tolist() == [2.0, 2.0]


def test_expect_of_another_kind_lets_the_hang_through(npugraph):
    def fn(rank):
        if rank == 0:
            dist.all_reduce(torch.ones(1, device="npu"))

    with npugraph.expect("deadlock"):
        with pytest.raises(DeviceHang):
            with npugraph.expect("race"):
                npugraph.run_ranks(fn)


def test_circular_order_across_communicators_on_one_stream_hangs(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
        t = torch.ones(2, device="npu")
        for group in ((first, second) if rank == 0 else (second, first)):
            dist.all_reduce(t, group=group)   # circular
        return t.cpu()

    message = str(run_failing(npugraph, fn, DeviceHang, hazard="can block each other forever"))
    line = line_of("# circular")
    for comm in ("hccl/1", "hccl/2"):     # both issued by both ranks, each queued behind the other
        assert re.search(rf"all_reduce #0 of communicator '{comm}': issued by rank \d at tests/distributed/"
                         rf"test_failures.py:{line}, rank \d at tests/distributed/test_failures.py:{line}", message)


def test_issue_order_across_communicators_on_separate_streams_is_free(npugraph):
    """HCCL launches return at once: each card may reach its two communicators' collectives in its
    own order when they run on streams of their own (the seed's situation, without the cores)."""
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
        a, b = torch.ones(2, device="npu") * (rank + 1), torch.ones(2, device="npu") * (rank + 3)
        streams = {first: torch.npu.Stream(), second: torch.npu.Stream()}
        main = torch.npu.current_stream()
        for group, t in ((first, a), (second, b)) if rank == 0 else ((second, b), (first, a)):
            streams[group].wait_stream(main)
            with torch.npu.stream(streams[group]):
                dist.all_reduce(t, group=group)
        for s in streams.values():
            main.wait_stream(s)
        return (a * 10).cpu().tolist(), b.cpu().tolist()

    assert npugraph.run_ranks(fn) == [([30.0, 30.0], [7.0, 7.0])] * 2
    npugraph.assert_clean()


def test_a_rank_that_returns_without_a_collective_its_peer_issued(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        if rank == 0:
            dist.all_reduce(torch.ones(1, device="npu"))   # never completes

    message = str(run_failing(npugraph, fn, DeviceHang, hazard="never issues it"))
    assert message.startswith("device hang: every rank returned with device work that can never run")
    assert re.search(rf"all_reduce #0 of communicator 'hccl/0': issued by rank 0 at tests/distributed/"
                     rf"test_failures.py:{line_of('# never completes')}; never issued by rank 1 \(done\)", message)


def test_a_rank_waiting_for_a_peer_that_never_issues_is_released_when_the_peer_returns(npugraph):
    def fn(rank):
        t = torch.ones(1, device="npu")
        if rank == 0:
            dist.all_reduce(t)
            return t.item()                 # waits for rank 1, which returns
        return None

    message = str(run_failing(npugraph, fn, DeviceHang, hazard="never issues it"))
    assert "rank 0 the host (reading the result of aten::_local_scalar_dense)" in message


def test_an_exception_in_one_rank_propagates_with_the_rank_named(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        if rank == 1:
            raise ValueError("bad shard")
        t = torch.ones(1, device="npu")
        dist.all_reduce(t)
        return t.cpu()

    error = run_failing(npugraph, fn, ValueError, hazard="never issues it")
    assert str(error) == "bad shard"
    assert error.__notes__ == ["(raised in rank 1 (npu:1) of npugraph.run_ranks)"]


def test_arguments_that_disagree_across_ranks_name_both_ranks(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        dist.all_reduce(torch.ones(2 + rank, device="npu"))

    message = str(run_failing(npugraph, fn))
    assert "all_reduce #0 of communicator 'hccl/0': the ranks pass different tensors " \
           "(rank 0: [((2,), 'float32')], rank 1: [((3,), 'float32')])" in message
    assert "rank 0 issued all_reduce at tests/distributed" in message


def test_split_sizes_that_do_not_pair_up_are_an_error(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        out = torch.empty(4, device="npu")
        dist.all_to_all_single(out, torch.ones(4, device="npu"), [2, 2], [2, 2] if rank == 0 else [1, 3])

    assert "rank 1 sends 1 rows to rank 0, which expects 2" in str(run_failing(npugraph, fn))


def test_a_rank_blocked_outside_the_device_ends_by_the_groups_timeout(npugraph):
    """The last resort: no device state explains the wait, so the process group's timeout does."""
    issued = threading.Event()

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2, timeout=timedelta(seconds=1))
        if rank == 1:
            issued.wait(30)                 # rank 0 is about to block in its read (however slow its first ops)
            time.sleep(2)                   # blocked in user code (then aborted, within run_ranks' grace)
        t = torch.ones(1, device="npu")
        dist.all_reduce(t)
        if rank == 0:
            issued.set()
        return t.cpu()

    message = str(run_failing(npugraph, fn, hazard="never issues it", by_state=False))
    assert message.startswith("no progress for 1 s: rank 0 the host (read sync")
    assert "rank 1 running but issuing nothing" in message


def test_a_rank_using_another_ranks_npu_is_an_error(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        dist.all_reduce(torch.ones(1, device="npu:0"))

    error = run_failing(npugraph, fn, ValueError, hazard="never issues it")
    assert str(error).startswith("all_reduce on rank 1: tensors on npu:0, but rank 1's process groups use npu:1")


def test_init_with_another_ranks_number_is_a_clear_error(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=0, world_size=2)

    with pytest.raises(RuntimeError, match=r"rank 1 of npugraph.run_ranks called init_process_group with rank=0"):
        npugraph.run_ranks(fn)


def test_more_ranks_than_emulated_devices_names_the_marker(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=4)

    with pytest.raises(RuntimeError, match=r"the test emulates 2 NPU\(s\); mark it @pytest.mark.npu_devices\(4\)"):
        npugraph.run_ranks(fn)


def test_process_group_state_is_gone_after_run_ranks(npugraph):
    """Groups a rank left behind are destroyed; c10d, the environment and rendezvous are restored."""
    world, environ = c10d._world, os.environ

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        dist.new_group([0, 1])
        return dist.is_initialized()

    assert npugraph.run_ranks(fn) == [True, True]
    assert not dist.is_initialized() and dist.group.WORLD is None
    assert c10d._world is world and os.environ is environ and "RANK" not in os.environ
    with pytest.raises(RuntimeError):
        torch._C._distributed_c10d._resolve_process_group("0")
    # a second run in the same test starts from scratch, under distinct communicator names
    assert npugraph.run_ranks(fn) == [True, True]
    groups = [r.group for r in npugraph.trace.records if isinstance(r, T.GroupCreated)]
    assert groups == ["hccl/0", "hccl/1", "hccl/0@2", "hccl/1@2"]


def test_a_later_test_has_no_process_group(npugraph):
    assert not dist.is_initialized()
    assert type(c10d._world) is c10d._World
