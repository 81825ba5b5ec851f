"""Ranks as processes (issue 28): ``torch.multiprocessing.spawn`` / ``npugraph.run_ranks(processes=True)``
ranks that meet through ``init_process_group("hccl", init_method=...)``'s store; their traces come back to
the test, whose analyses see every rank at once.

The rank functions live at module level: spawned processes import them.  Starting a process that
imports torch takes seconds, so each test here starts one world of two ranks.
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from examples import test_seed000_core_deadlock as seed000
from pytest_npugraph.trace import EventRecord, EventWait, Kernel

pytestmark = [pytest.mark.npu_devices(2), pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")]


def all_reduce_then_race(rank, store, out):
    """Rank 0 and 1 all-reduce over a file store; rank 1 then reads on a side stream what the main
    stream writes, with no wait between them (a race in one child only)."""
    import torch_npu  # noqa: F401

    torch.npu.set_device(rank)
    dist.init_process_group("hccl", init_method=f"file://{store}", rank=rank, world_size=2)
    t = torch.full((4,), float(rank + 1)).npu()
    dist.all_reduce(t)
    torch.save(t.cpu(), os.path.join(out, f"rank{rank}.pt"))
    if rank == 1:
        side = torch.npu.Stream()
        x = torch.ones(8).npu()
        x.mul_(2)                          # main stream writes x
        with torch.npu.stream(side):
            y = x + 1                      # side stream reads x: unordered with the write
        torch.npu.synchronize()
        del y
    dist.destroy_process_group()


def test_spawned_ranks_all_reduce_and_a_race_in_one_child_fails_the_test(npugraph, tmp_path):
    with npugraph.expect("race", match="aten::mul_"):       # (unabsorbed, it fails the test)
        mp.spawn(all_reduce_then_race, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
        races = [h for h in npugraph.hazards if h.kind == "race"]
        line = f"test_rank_processes.py:{_line('x.mul_(2)')}"
        assert races and any(w.endswith(line) for h in races for w in h.where)
        assert all(s.startswith("npu:1/") for h in races for s in h.streams)    # rank 1's device
    for rank in range(2):
        assert torch.load(tmp_path / f"rank{rank}.pt").tolist() == [3.0] * 4
    kernels = [r for r in npugraph.trace.records if getattr(r, "op", "") == "hccl::all_reduce"]
    assert sorted(npugraph.trace.streams[k.stream].device for k in kernels) == [0, 1]
    assert len({k.collective for k in kernels}) == 1           # the two members of one collective


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line(" not in line)


def seed000_rank(rank, limit):
    """Seed 000's step in a process of its own (the thread version is examples/test_seed000_core_deadlock.py)."""
    import torch_npu  # noqa: F401

    torch.npu.set_device(rank)
    return seed000.moe_step(rank, limit)


@pytest.fixture
def seed000_profiles(op_profiles):
    """examples/conftest.py's collective figures (reduce-scatter 16 vector cores, MoE dispatch/combine 24),
    answered in the parent: the rank processes get them with the rest of the test's settings."""
    op_profiles.update({"reduce_scatter": {"kind": "HCCL", "vector": 16, "all_resident": True},
                        "npu_moe_distribute_dispatch": {"kind": "MC2", "vector": 24, "all_resident": True},
                        "npu_moe_distribute_combine": {"kind": "MC2", "vector": 24, "all_resident": True}})


@pytest.mark.npu_chip("Ascend910B1")
def test_seed000_cross_order_deadlock_is_found_across_processes(npugraph, seed000_profiles):
    # one report per root cause: the oversubscription is the deadlock report's cause line
    with npugraph.expect("deadlock", match=r"npu:0, npu:1 can block each other forever(.|\n)*"
                                           r"cause: .*need 88 vector cores together, but the device has 48(.|\n)*"
                                           r"fix: limit aten::nonzero .* to 8 vector cores"):
        npugraph.run_ranks(seed000_rank, None, processes=True)
    assert [h.kind for h in npugraph.hazards] == []


@pytest.mark.npu_chip("Ascend910B1")
def test_seed000_fixed_is_clean_and_correct_across_processes(npugraph, seed000_profiles):
    results = npugraph.run_ranks(seed000_rank, 8, processes=True)
    for rank, (shard, moe_out, kept) in enumerate(results):
        torch.testing.assert_close(shard, (torch.arange(8.0) * 3)[4 * rank:4 * rank + 4])
        _, x, _, scales, padding = seed000.rank_inputs(rank)
        torch.testing.assert_close(moe_out, x * scales.sum(1, keepdim=True))
        assert kept.flatten().tolist() == torch.nonzero(padding).flatten().tolist()
    assert {r.group for r in npugraph.trace.records if type(r).__name__ == "GroupCreated"} >= {"hccl/1", "hccl/2"}
    npugraph.assert_clean()


def exchange(rank, unmatched):
    """Rank 0 sends to rank 1 and receives back (env:// world of run_ranks); ``unmatched``: rank 1 never
    receives."""
    t = torch.arange(4.0).npu() * (rank + 1)
    r = torch.zeros(4).npu()
    dist.init_process_group("hccl")
    if rank == 0:
        dist.send(t, dst=1)
        if not unmatched:
            dist.recv(r, src=1)
    elif not unmatched:
        dist.recv(r, src=0)
        dist.send(t, dst=0)
    return r.cpu().tolist()


def test_send_recv_between_rank_processes(npugraph):
    assert npugraph.run_ranks(exchange, False, processes=True) == [[0.0, 2.0, 4.0, 6.0], [0.0, 1.0, 2.0, 3.0]]
    npugraph.assert_clean()


def test_a_send_never_received_across_processes_is_a_deadlock(npugraph):
    with npugraph.expect("deadlock", match="npu:1, which never issues it"):
        npugraph.run_ranks(exchange, True, processes=True)


def pipeline_stage(rank):
    """A pipeline hand-off as PP code writes it: isend/irecv on a side stream behind wait_stream, an
    event back to the main stream, then a batch_isend_irecv exchange."""
    dist.init_process_group("hccl")
    side = torch.npu.Stream()
    x = torch.arange(4.0).npu() * (rank + 1)
    out, back = torch.zeros(4).npu(), torch.zeros(4).npu()
    done = torch.npu.Event()
    with torch.npu.stream(side):
        side.wait_stream(torch.npu.current_stream())
        work = dist.isend(x, dst=1) if rank == 0 else dist.irecv(out, src=0)
        done.record()
    work.wait()
    torch.npu.current_stream().wait_event(done)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1 - rank), dist.P2POp(dist.irecv, back, 1 - rank)]):
        w.wait()
    result = (out + back).cpu().tolist()
    dist.destroy_process_group()
    return result


def _device_work(npugraph, records) -> dict:
    """Per device, in program order: each event record/wait and point-to-point task with its stream (the
    device's stream number) and its channel (without the world's suffix) and place in it."""
    out = {}
    for r in records:
        if isinstance(r, (EventRecord, EventWait)) or isinstance(r, Kernel) and r.collective:
            stream = npugraph.trace.streams[r.stream]
            channel = (r.collective[0].split("~")[0], r.collective[1]) if isinstance(r, Kernel) else None
            out.setdefault(stream.device, []).append((type(r).__name__, stream.stream_id, getattr(r, "op", ""), channel))
    return out


def test_point_to_point_in_rank_processes_uses_the_streams_and_events_of_rank_threads(npugraph):
    """The same rank function as threads then as processes: the same values, the same tasks on the same
    streams behind the same events, and the two worlds' channels are told apart (``~2``): pairing the
    processes' hccl/0/p2p:0->1 #0 with the threads' was a false deadlock."""
    start = len(npugraph.trace.records)
    threads = npugraph.run_ranks(pipeline_stage)
    middle = len(npugraph.trace.records)
    processes = npugraph.run_ranks(pipeline_stage, processes=True)
    assert threads == processes == [[0.0, 2.0, 4.0, 6.0], [0.0, 2.0, 4.0, 6.0]]
    by_threads = _device_work(npugraph, npugraph.trace.records[start:middle])
    by_processes = _device_work(npugraph, npugraph.trace.records[middle:])
    assert by_threads == by_processes
    # rank 0: the isend on the side stream, the batch on the main stream (stream 0)
    assert [(op, sid == 0) for _, sid, op, _ in by_threads[0] if op] == [
        ("hccl::send", False), ("hccl::send", True), ("hccl::recv", True)]
    channels = {r.collective[0] for r in npugraph.trace.records[middle:] if isinstance(r, Kernel) and r.collective}
    assert channels == {"hccl/0/p2p:0->1~2", "hccl/0/p2p:1->0~2"}
    npugraph.assert_clean()


def cann_of_rank(rank):
    import torch_npu
    from pytest_npugraph import cann

    return torch_npu.npu.utils.get_cann_version(), cann.current().aiv_minimum("all_reduce", 2)


@pytest.mark.npu_cann("9.0.0")
def test_rank_processes_emulate_the_tests_cann_version(npugraph):
    """The CANN release (here 9.0.0, whose AIV all_reduce refuses fewer vector cores than ranks) reaches
    each rank process with the rest of the test's settings, not the default release (8.5.0)."""
    assert npugraph.run_ranks(cann_of_rank, processes=True) == [("9.0.0", 2), ("9.0.0", 2)]
