"""torch.distributed collectives inside compiled functions, and torch's functional collectives, in run_ranks.

Why: ``torch.compile`` turns ``dist.all_reduce(t)`` & co. into torch's functional collectives
(``_c10d_functional.all_reduce`` + ``wait_tensor``, ...); on NPU tensors they must reach the emulated
HCCL group with NPU tensors, give the eager values on every rank, and leave in the trace what the
eager collectives leave (one kernel per rank per call, keyed (group, seq)) so the deadlock analysis
still sees a rank that skips one.
"""
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torch_npu  # noqa: F401
import torchair
from pytest_npugraph.errors import NotEmulated
from pytest_npugraph.runtime.executor import DeviceHang
from pytest_npugraph.trace import Kernel

pytestmark = [pytest.mark.npu_devices(2),
              pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning")]
WORLD = 2


def backend(mode):
    if mode in ("aot_eager", "npugraph_ex"):
        return mode
    config = torchair.CompilerConfig()
    config.mode = mode
    return torchair.get_npu_backend(compiler_config=config)


def collective_kernels(npugraph):
    return [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.collective]


def per_rank(npugraph):
    """{device: [kernel op, ...]} of the collective kernels, in record order."""
    out = {}
    for k in collective_kernels(npugraph):
        out.setdefault(npugraph.trace.streams[k.stream].device, []).append(k.op)
    return out


def data(rank, salt):
    g = torch.Generator().manual_seed(100 * salt + rank)
    return torch.randint(-8, 9, (4, 3), generator=g).float()


def step(x):
    """Each collective on a fresh result of ``x``, and math on each result."""
    y = x * 2
    dist.all_reduce(y)
    gathered = torch.empty(x.shape[0] * WORLD, x.shape[1], device=x.device)
    dist.all_gather_into_tensor(gathered, x + 1)
    scattered = torch.empty(x.shape[0] // WORLD, x.shape[1], device=x.device)
    dist.reduce_scatter_tensor(scattered, x * 3)
    return y + 1, gathered - 1, scattered * 2


def expected(rank):
    xs = [data(r, 0) for r in range(WORLD)]
    total = sum(x * 2 for x in xs)
    rows = xs[0].shape[0] // WORLD
    return [total + 1, torch.cat([x + 1 for x in xs]) - 1,
            sum(x[rank * rows:(rank + 1) * rows] * 3 for x in xs) * 2]


@pytest.mark.parametrize("mode", ["aot_eager", "max-autotune"])
def test_compiled_collectives_give_the_eager_values_on_every_rank(npugraph, mode):
    calls = 2

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        x = data(rank, 0).npu()
        eager = [t.cpu() for t in step(x)]
        compiled = torch.compile(step, backend=backend(mode), dynamic=False, fullgraph=True)
        runs = [[t.cpu() for t in compiled(x)] for _ in range(calls)]
        return eager, runs

    results = npugraph.run_ranks(fn)
    for rank, (eager, runs) in enumerate(results):
        for got, want in zip(eager, expected(rank)):
            torch.testing.assert_close(got, want)
        for run in runs:
            for got, want in zip(run, eager):
                torch.testing.assert_close(got, want)
    one_step = ["hccl::all_reduce", "hccl::all_gather", "hccl::reduce_scatter"]
    assert per_rank(npugraph) == {0: one_step * (1 + calls), 1: one_step * (1 + calls)}
    by_key = {}
    for k in collective_kernels(npugraph):
        by_key.setdefault(k.collective, []).append(npugraph.trace.streams[k.stream].device)
    assert len(by_key) == 3 * (1 + calls) and all(sorted(d) == [0, 1] for d in by_key.values())
    npugraph.assert_clean()


def test_the_functional_api_eagerly(npugraph):
    """torch.distributed._functional_collectives on NPU tensors: out-of-place results on the input's
    device, the inputs untouched, the Work waited on by wait_tensor (AsyncCollectiveTensor)."""
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        group = dist.group.WORLD
        x = data(rank, 1).npu()
        before = x.cpu()
        reduced = funcol.all_reduce(x, "sum", group)
        biggest = funcol.all_reduce(x, "max", group)
        gathered = funcol.all_gather_tensor(x, 0, group)
        scattered = funcol.reduce_scatter_tensor(x, "sum", 0, group)
        swapped = funcol.all_to_all_single(x, None, None, group)
        sent = funcol.broadcast(x, 1, group)
        outs = [funcol.wait_tensor(t) for t in (reduced, biggest, gathered, scattered, swapped, sent)]
        assert all(t.device == torch.device("npu", rank) for t in outs)
        return before, x.cpu(), [t.cpu() for t in outs]

    results = npugraph.run_ranks(fn)
    xs = [data(r, 1) for r in range(WORLD)]
    for rank, (before, after, (reduced, biggest, gathered, scattered, swapped, sent)) in enumerate(results):
        torch.testing.assert_close(after, before)
        torch.testing.assert_close(reduced, xs[0] + xs[1])
        torch.testing.assert_close(biggest, torch.maximum(xs[0], xs[1]))
        torch.testing.assert_close(gathered, torch.cat(xs))
        torch.testing.assert_close(scattered, xs[0][2 * rank:2 * rank + 2] + xs[1][2 * rank:2 * rank + 2])
        torch.testing.assert_close(swapped, torch.cat([xs[0][2 * rank:2 * rank + 2], xs[1][2 * rank:2 * rank + 2]]))
        torch.testing.assert_close(sent, xs[1])
    ops = ["hccl::all_reduce", "hccl::all_reduce", "hccl::all_gather", "hccl::reduce_scatter", "hccl::all_to_all",
           "hccl::broadcast"]
    assert per_rank(npugraph) == {0: ops, 1: ops}
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", ["aot_eager", "max-autotune"])
def test_a_compiled_collective_one_rank_skips_is_a_device_hang_as_eagerly(npugraph, mode):
    def reduce_twice(x, again: bool):
        y = x + 1
        dist.all_reduce(y)
        if again:
            dist.all_reduce(y)     # rank 0 only
        return y

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        compiled = torch.compile(reduce_twice, backend=backend(mode), dynamic=False)
        x = torch.ones(4, device="npu")
        return compiled(x, rank == 0).cpu()    # rank 1 never issues the second: the host waits for ever

    with npugraph.expect("deadlock", match="never issues it"):
        with pytest.raises(DeviceHang) as info:
            npugraph.run_ranks(fn)
    # TorchAir's graph runs node by node: the kernel names the collective's line; aot_eager's graph
    # is one frame of the compiled function, named by its first line
    marker = "# rank 0 only" if mode == "max-autotune" else "def reduce_twice"
    line = next(i for i, text in enumerate(open(__file__), 1) if marker in text and "marker" not in text)
    assert f"all_reduce #1 of communicator 'hccl/0': issued by rank 0 at tests/distributed/" \
           f"test_compiled_collectives.py:{line}; never issued by rank 1 (done)" in str(info.value)
    assert per_rank(npugraph) == {0: ["hccl::all_reduce"] * 2, 1: ["hccl::all_reduce"]}


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_collectives_in_a_captured_graph_are_a_clear_error(npugraph, mode):
    """The graph modes capture the compiled graph into an NPU graph; collectives in a capture are
    not emulated: every rank gets the error, and the run ends (no hang)."""
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        compiled = torch.compile(step, backend=backend(mode), dynamic=False, fullgraph=True)
        compiled(data(rank, 0).npu())

    with pytest.raises(NotEmulated, match="all_reduce: collectives inside NPU graph capture are not emulated"):
        npugraph.run_ranks(fn)


def test_wait_tensor_waits_on_the_work_of_its_result(npugraph, monkeypatch):
    """torch's wait_tensor unregisters the result's Work and waits on it (on hardware the current
    stream then waits for HCCL's); a result nobody waits on keeps its Work unwaited."""
    from torch_npu.distributed._process_group import HcclProcessGroup

    waited = []

    class Work(dist.Work):
        def __init__(self, work, label):
            super().__init__()
            self.work, self.label = work, label

        def wait(self, timeout=None):
            waited.append(self.label)
            return self.work.wait()

    allreduce, issued = HcclProcessGroup.allreduce, []

    def spied(self, tensors, opts=None):
        device = f"npu:{tensors[0].device.index}"
        label = f"{device} #{sum(seen.startswith(device) for seen in issued)}"     # ranks append concurrently
        issued.append(label)
        return Work(allreduce(self, tensors, opts), label)
    monkeypatch.setattr(HcclProcessGroup, "allreduce", spied)

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        x = torch.ones(2, device="npu")
        kept = torch.ops._c10d_functional.all_reduce(x, "sum", dist.group.WORLD.group_name)
        torch.ops._c10d_functional.all_reduce(x * 2, "sum", dist.group.WORLD.group_name)   # never waited on
        same = torch.ops._c10d_functional.wait_tensor(kept)
        assert same is kept
        torch.ops._c10d_functional.wait_tensor(kept)      # its Work is gone: nothing more to wait on
        return kept.cpu().tolist()

    assert npugraph.run_ranks(fn) == [[2.0, 2.0]] * 2
    assert sorted(issued) == ["npu:0 #0", "npu:0 #1", "npu:1 #0", "npu:1 #1"]
    assert sorted(waited) == ["npu:0 #0", "npu:1 #0"]     # the Work of ``kept`` only, once per rank


def reduce_ops(x):
    mean, biggest = x + 0, x * 1
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    dist.all_reduce(biggest, op=dist.ReduceOp.MAX)
    return mean, biggest


def test_compiled_reduce_ops(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        x = data(rank, 2).npu()
        return [t.cpu() for t in torch.compile(reduce_ops, backend="aot_eager", fullgraph=True)(x)]

    xs = [data(r, 2) for r in range(WORLD)]
    for mean, biggest in npugraph.run_ranks(fn):
        torch.testing.assert_close(mean, (xs[0] + xs[1]) / 2)
        torch.testing.assert_close(biggest, torch.maximum(xs[0], xs[1]))
    npugraph.assert_clean()


@pytest.mark.npu_devices(1)
def test_a_world_of_one_outside_run_ranks(npugraph):
    dist.init_process_group("hccl", rank=0, world_size=1, store=dist.HashStore())
    try:
        x = data(0, 3).npu()
        mean, biggest = torch.compile(reduce_ops, backend="aot_eager", fullgraph=True)(x)
        torch.testing.assert_close(mean.cpu(), data(0, 3))
        torch.testing.assert_close(biggest.cpu(), data(0, 3))
    finally:
        dist.destroy_process_group()
    assert per_rank(npugraph) == {0: ["hccl::all_reduce"] * 2}
    npugraph.assert_clean()
