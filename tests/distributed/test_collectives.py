"""torch.distributed on backend "hccl" across the emulated NPUs of a test (npugraph.run_ranks).

Why: model code under test runs its collectives unchanged; every collective must give the
result the math says, on every rank, for the dtypes models use, and leave in the trace what
the core/deadlock analyses match: one kernel per rank, on its stream, keyed (group, seq).
"""
import os
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_npu
from pytest_npugraph.trace import DeviceCores, GroupCreated, Kernel

pytestmark = [pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning"),
              pytest.mark.filterwarnings("ignore:barrier\\(\\). using the device:UserWarning")]
DTYPES = [torch.float32, torch.bfloat16, torch.int32]
WORLDS = [pytest.param(n, marks=pytest.mark.npu_devices(n), id=f"{n}ranks") for n in (2, 4)]


def data(rank, shape, dtype, salt=0):
    """Distinct small integers per rank and call site: exact in bf16 and int, sums included."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-8, 9, shape, generator=g).to(dtype)


def inputs(world, shape, dtype, salt):
    return [data(r, shape, dtype, salt) for r in range(world)]


def reduced(tensors, how):
    return getattr(torch.stack([t.to(torch.float64) for t in tensors]), how)(0).to(tensors[0].dtype)


def kernels(npugraph, op=None):
    return [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.collective and op in (None, r.op)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_collectives_match_the_straightforward_computation(npugraph, world, dtype):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=world)
        out = {}
        t = data(rank, (3, 4), dtype, 0).npu()
        dist.all_reduce(t)
        out["sum"] = t.cpu()
        t = data(rank, (5,), dtype, 1).npu()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out["max"] = t.cpu()
        rs = torch.empty(2, 3, dtype=dtype, device="npu")
        dist.reduce_scatter_tensor(rs, data(rank, (2 * world, 3), dtype, 2).npu())
        out["reduce_scatter"] = rs.cpu()
        ag = torch.empty(2 * world, 3, dtype=dtype, device="npu")
        dist.all_gather_into_tensor(ag, data(rank, (2, 3), dtype, 3).npu())
        out["all_gather"] = ag.cpu()
        b = data(rank, (4,), dtype, 4).npu()
        dist.broadcast(b, src=world - 1)
        out["broadcast"] = b.cpu()
        parts = [torch.empty(3, dtype=dtype, device="npu") for _ in range(world)]
        dist.all_gather(parts, data(rank, (3,), dtype, 5).npu())
        out["all_gather_list"] = torch.stack([p.cpu() for p in parts])
        dist.barrier()
        return out

    results = npugraph.run_ranks(fn)
    for rank, out in enumerate(results):
        torch.testing.assert_close(out["sum"], reduced(inputs(world, (3, 4), dtype, 0), "sum"))
        torch.testing.assert_close(out["max"], reduced(inputs(world, (5,), dtype, 1), "amax"))
        chunks = [x[2 * rank:2 * rank + 2] for x in inputs(world, (2 * world, 3), dtype, 2)]
        torch.testing.assert_close(out["reduce_scatter"], reduced(chunks, "sum"))
        torch.testing.assert_close(out["all_gather"], torch.cat(inputs(world, (2, 3), dtype, 3)))
        torch.testing.assert_close(out["broadcast"], inputs(world, (4,), dtype, 4)[world - 1])
        torch.testing.assert_close(out["all_gather_list"], torch.stack(inputs(world, (3,), dtype, 5)))


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_single_with_uneven_split_sizes(npugraph, world):
    """Rank q sends q + r + 1 rows to rank r: every (sender, receiver) pair has its own count."""
    def rows(q, r):
        return q + r + 1

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=world)
        send = [rows(rank, r) for r in range(world)]
        recv = [rows(q, rank) for q in range(world)]
        x = torch.cat([torch.full((n, 2), 100 * rank + r, dtype=torch.int64) for r, n in enumerate(send)])
        out = torch.empty(sum(recv), 2, dtype=torch.int64, device="npu")
        dist.all_to_all_single(out, x.npu(), output_split_sizes=recv, input_split_sizes=send)
        return out.cpu()

    for rank, out in enumerate(npugraph.run_ranks(fn)):
        expected = torch.cat([torch.full((rows(q, rank), 2), 100 * q + rank) for q in range(world)])
        torch.testing.assert_close(out, expected)


@pytest.mark.npu_devices(4)
def test_even_all_to_all_and_list_forms(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=4)
        x = torch.arange(8, dtype=torch.float32).npu() + 10 * rank
        even = torch.empty(8, device="npu")
        dist.all_to_all_single(even, x)
        outs = [torch.empty(2, device="npu") for _ in range(4)]
        dist.all_to_all(outs, list(x.chunk(4)))
        rs = torch.empty(2, device="npu")
        dist.reduce_scatter(rs, [c.clone() for c in x.chunk(4)])
        return even.cpu(), torch.cat([o.cpu() for o in outs]), rs.cpu()

    for rank, (even, listed, rs) in enumerate(npugraph.run_ranks(fn)):
        expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 10 * q for q in range(4)])
        torch.testing.assert_close(even, expected)
        torch.testing.assert_close(listed, expected)
        torch.testing.assert_close(rs, expected.view(4, 2).sum(0))


@pytest.mark.npu_devices(4)
def test_rooted_collectives_reduce_gather_scatter(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=4, device_id=torch.device("npu", rank))
        r = torch.full((2,), rank + 1.0).npu()
        dist.reduce(r, dst=1, op=dist.ReduceOp.PRODUCT)
        gathered = [torch.empty(2, device="npu") for _ in range(4)] if rank == 2 else None
        dist.gather(torch.full((2,), float(rank)).npu(), gathered, dst=2)
        s = torch.empty(3, device="npu")
        dist.scatter(s, [torch.full((3,), 10.0 + q).npu() for q in range(4)] if rank == 0 else None, src=0)
        return r.cpu().tolist(), gathered and [t.cpu().tolist() for t in gathered], s.cpu().tolist()

    results = npugraph.run_ranks(fn)
    assert [r for r, _, _ in results] == [[1.0, 1.0], [24.0, 24.0], [3.0, 3.0], [4.0, 4.0]]
    assert results[2][1] == [[float(q)] * 2 for q in range(4)]
    assert [s for _, _, s in results] == [[10.0 + rank] * 3 for rank in range(4)]


@pytest.mark.npu_devices(2)
def test_a_host_read_right_after_the_collective_sees_its_result(npugraph, monkeypatch):
    """The host of the first rank to issue reads while the last rank's thread is still computing
    the collective (made slow here): the read waits for the results and never sees the inputs (a
    task leaves its stream's queue only after its work ran)."""
    from pytest_npugraph.runtime import collectives

    def slow_all_reduce(calls, math=collectives.MATH["all_reduce"]):
        time.sleep(0.05)
        math(calls)

    monkeypatch.setitem(collectives.MATH, "all_reduce", slow_all_reduce)

    def fn(rank):
        seen = []
        for i in range(4):
            t = torch.ones(1, device="npu") * (rank + i)
            dist.all_reduce(t)
            seen.append(t.item() if i % 2 else t.cpu().tolist()[0])
        return seen

    assert npugraph.run_ranks(fn) == [[float(2 * i + 1) for i in range(4)]] * 2


@pytest.mark.npu_devices(2)
def test_destroy_and_init_again_in_one_run_gets_a_fresh_communicator(npugraph):
    def fn(rank):
        seen = []
        for i in range(2):
            dist.init_process_group("hccl", rank=rank, world_size=2)
            t = torch.ones(1, device="npu") * (i + 1)
            dist.all_reduce(t)
            seen.append((t.item(), dist.group.WORLD._get_backend(torch.device("npu")).get_hccl_comm_name(rank)))
            dist.destroy_process_group()
        return seen

    assert npugraph.run_ranks(fn) == [[(2.0, "hccl/0"), (4.0, "hccl/0.1")]] * 2


@pytest.mark.npu_devices(2)
def test_async_ops_return_works_that_wait(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        t = torch.full((4,), rank + 1.0).npu()
        out = torch.empty(8, device="npu")
        works = [dist.all_reduce(t, async_op=True),
                 dist.all_gather_into_tensor(out, torch.full((4,), float(rank)).npu(), async_op=True),
                 dist.barrier(async_op=True)]
        assert all(isinstance(w, dist.Work) for w in works)
        assert all(w.wait() for w in works) and all(w.is_completed() for w in works)
        (fut_value,) = works[0].get_future().value()
        return t.cpu(), out.cpu(), fut_value is t

    for t, out, same in npugraph.run_ranks(fn):
        torch.testing.assert_close(t, torch.full((4,), 3.0))
        torch.testing.assert_close(out, torch.tensor([0.0] * 4 + [1.0] * 4))
        assert same


@pytest.mark.npu_devices(4)
def test_new_group_and_subgroups_reduce_only_among_members(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=4)
        evens = dist.new_group([0, 2])
        pair, _ = dist.new_subgroups(2)            # {0, 1} and {2, 3}
        x = torch.tensor([float(rank)]).npu()
        if rank in (0, 2):
            dist.all_reduce(x, group=evens)
        y = torch.tensor([float(rank)]).npu()
        dist.all_reduce(y, group=pair)
        z = torch.tensor([float(rank)]).npu()
        dist.broadcast(z, src=3, group=pair) if rank >= 2 else dist.broadcast(z, group_src=0, group=pair)
        comm = pair._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
        return x.item(), y.item(), z.item(), dist.get_rank(pair), comm

    results = npugraph.run_ranks(fn)
    assert [r[:4] for r in results] == [(2.0, 1.0, 0.0, 0), (1.0, 1.0, 0.0, 1), (2.0, 5.0, 3.0, 0),
                                        (3.0, 5.0, 3.0, 1)]
    assert results[0][4] == results[1][4] != results[2][4] == results[3][4]
    groups = {r.group: r.devices for r in npugraph.trace.records if isinstance(r, GroupCreated)}
    assert groups[results[0][4]] == (0, 1) and groups[results[2][4]] == (2, 3)
    assert len(groups) == 4     # world, evens, new_subgroups' {0, 1} and {2, 3}


@pytest.mark.npu_devices(2)
def test_env_based_init_as_under_torchrun(npugraph):
    """Each rank thread sees its own RANK/LOCAL_RANK/WORLD_SIZE; writes stay in that thread."""
    def fn(rank):
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.npu.set_device(local_rank)
        os.environ["MY_RANK_VAR"] = str(rank)
        dist.init_process_group(backend="hccl", init_method="env://", timeout=timedelta(seconds=60))
        t = torch.ones(2, device="npu") * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return (local_rank, dist.get_rank(), dist.get_world_size(), os.environ["MY_RANK_VAR"],
                torch.npu.current_device(), t.device.index, t.cpu().tolist())

    assert npugraph.run_ranks(fn) == [(0, 0, 2, "0", 0, 0, [3.0, 3.0]), (1, 1, 2, "1", 1, 1, [3.0, 3.0])]
    assert "MY_RANK_VAR" not in os.environ and "LOCAL_RANK" not in os.environ


@pytest.mark.npu_devices(2)
def test_tcp_init_method_and_object_collectives(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", init_method="tcp://127.0.0.1:29511", rank=rank, world_size=2)
        objects = [None, None]
        dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
        payload = [f"from {rank}"]
        dist.broadcast_object_list(payload, src=1)
        return objects, payload[0]

    assert npugraph.run_ranks(fn) == [([{"rank": 0, "name": "r0"}, {"rank": 1, "name": "r1"}], "from 1")] * 2


@pytest.mark.npu_devices(2)
def test_each_rank_records_its_collectives_on_its_current_stream_keyed_by_group_and_seq(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        side = torch.npu.Stream()
        x = torch.ones(8, device="npu")
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            dist.all_reduce(x)
            out = torch.empty(4, device="npu")
            dist.reduce_scatter_tensor(out, x)
        torch.npu.current_stream().wait_stream(side)   # else the barrier may hold the cores they wait for
        dist.barrier()

    npugraph.run_ranks(fn)
    trace = npugraph.trace
    ops = kernels(npugraph)
    assert [(trace.streams[k.stream].device, k.op, k.collective) for k in ops if trace.streams[k.stream].device == 0] \
        == [(0, "hccl::all_reduce", ("hccl/0", 0)), (0, "hccl::reduce_scatter", ("hccl/0", 1)),
            (0, "hccl::barrier", ("hccl/0", 2))]
    by_key = {}
    for k in ops:
        by_key.setdefault(k.collective, set()).add(trace.streams[k.stream].device)
    assert all(devices == {0, 1} for devices in by_key.values())
    for k in ops:
        label = trace.streams[k.stream].label
        assert label.endswith("/default") == (k.op == "hccl::barrier"), label
        assert k.cores.kind == "HCCL" and k.cores.vector == 0    # HOST mode, Ascend910B's default: no cores
        assert k.site.path.endswith("test_collectives.py")
    all_reduce = next(k for k in ops if k.op == "hccl::all_reduce")
    assert all_reduce.reads and all_reduce.writes == all_reduce.reads
    devices = [(r.device, r.cube, r.vector) for r in trace.records if isinstance(r, DeviceCores)]
    assert devices == [(0, npugraph.cube_cores, npugraph.vector_cores), (1, npugraph.cube_cores, npugraph.vector_cores)]


@pytest.mark.npu_devices(2)
def test_collective_profile_comes_from_the_users_hook(npugraph, op_profiles):
    op_profiles["all_reduce"] = {"kind": "HCCL", "vector": 16, "all_resident": True}

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        t = torch.ones(2, device="npu")
        dist.all_reduce(t)
        dist.broadcast(t, src=0)

    npugraph.run_ranks(fn)
    cores = {k.op: k.cores for k in kernels(npugraph)}
    assert (cores["hccl::all_reduce"].vector, cores["hccl::broadcast"].vector) == (16, 0)   # HOST mode: none


def test_single_rank_world_in_the_tests_own_thread(npugraph, monkeypatch):
    """world_size 1 needs no run_ranks (a one-card script); the group is the test's to destroy."""
    monkeypatch.setattr("sys.excepthook", sys.excepthook)   # init_process_group wraps it for the process
    dist.init_process_group("hccl", rank=0, world_size=1, store=dist.HashStore())
    try:
        assert dist.get_backend() == "hccl" and dist.is_hccl_available()
        t = torch.arange(4.0).npu()
        dist.all_reduce(t)
        torch.testing.assert_close(t.cpu(), torch.arange(4.0))
        pg = dist.group.WORLD
        backend = pg._get_backend(torch.device("npu"))
        assert isinstance(backend, torch_npu._C._distributed_c10d.ProcessGroupHCCL)
        assert backend.get_hccl_comm_name(0) == kernels(npugraph, "hccl::all_reduce")[0].collective[0]
    finally:
        dist.destroy_process_group()


def test_a_world_larger_than_the_test_outside_run_ranks_is_a_clear_error(npugraph):
    with pytest.raises(RuntimeError, match=r"world_size=2\) outside npugraph.run_ranks"):
        dist.init_process_group("hccl", rank=0, world_size=2, store=dist.HashStore())
    assert not dist.is_initialized()


def _internal_format_view(rank, which):
    """An all_to_all whose input or output is a FRACTAL_NZ tensor's view at an offset (torch_npu's
    test_all_to_all): ProcessGroupHCCL refuses it before launching; an ND view at an offset is fine."""
    torch_npu.npu.config.allow_internal_format = True
    base = torch.zeros(6, 4).npu()
    if which != "nd":
        base = torch_npu.npu_format_cast(base, 29)
    view = base[2:]
    other = torch.ones(4, 4).npu() * (rank + 1)
    inputs, outputs = ([view], [other]) if which == "input" else ([other], [view])
    if which == "nd":
        inputs, outputs = [view.fill_(rank + 1)], [torch.zeros(4, 4).npu()]
    try:
        dist.all_to_all(outputs, inputs)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return outputs[0].sum().item()


@pytest.mark.npu_devices(1)
@pytest.mark.parametrize("which", ["input", "output", "nd"])
def test_an_internal_format_view_at_an_offset_is_refused_as_hccl_refuses_it(npugraph, which):
    expected = 16.0 if which == "nd" else "For a tensor of internal format, it's storage_offset must be 0"
    assert npugraph.run_ranks(_internal_format_view, which) == [expected]


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("async_ops", [True, False])
def test_coalescing_manager_issues_the_blocks_all_reduces_as_one(npugraph, async_ops):
    """torch's _coalescing_manager (torch_npu's test_coalesced_manager): the all_reduces inside the block are
    collected and issued at its end through the group's _start/_end_coalescing and allreduce_coalesced."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        group = dist.distributed_c10d._get_default_group()
        tensors = [torch.full((3,), float(i + rank)).npu() for i in range(3)]
        with _coalescing_manager(group=group, device=torch.device(f"npu:{rank}"), async_ops=async_ops) as cm:
            for t in tensors:
                dist.all_reduce(t)
        if async_ops:
            cm.wait()
        return [t.cpu().tolist() for t in tensors]
    assert npugraph.run_ranks(rank_fn) == [[[1.0] * 3, [3.0] * 3, [5.0] * 3]] * 2
    assert len(kernels(npugraph, "hccl::all_reduce")) == 2      # one coalesced call per rank
    npugraph.assert_clean()


def _bad_splits(rank):
    """Each rank passes all_to_all_single sizes HCCL refuses on the calling rank, before the launch."""
    cases = [(torch.zeros(10), torch.zeros(12), [6, 6], [4, 8]),     # input splits sum to 12, not 10
             (torch.zeros(12), torch.zeros(12), [6, 6], [4, 4, 4])]  # three splits for two ranks
    out, inp, out_sizes, in_sizes = cases[rank]
    messages = []
    for args in ((out.npu(), inp.npu(), out_sizes, in_sizes), (torch.zeros(3).npu(), torch.zeros(3).npu())):
        try:
            dist.all_to_all_single(*args)
        except RuntimeError as exc:
            messages.append(str(exc).splitlines()[0])
    return messages


@pytest.mark.npu_devices(2)
def test_all_to_all_single_refuses_wrong_split_sizes_on_the_calling_rank(npugraph):
    """torch_npu's test_alltoall_single_2p_expect: the error is the caller's, at the call, in HCCL's words."""
    undivided = "Tensor's dim 0 does not divide equally across group size"
    assert npugraph.run_ranks(_bad_splits) == [["Split sizes doesn't match total dim 0 size", undivided],
                                              ["Number of tensor splits not equal to group size", undivided]]
    assert kernels(npugraph) == []
