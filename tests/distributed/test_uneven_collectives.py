"""torch_npu's own collectives with per-rank sizes: ``torch_npu.distributed.reduce_scatter_tensor_uneven``
(ReduceScatterV), ``all_gather_into_tensor_uneven`` (AllGatherV) and ``all_to_all_vc`` (AlltoAllVC).

Why: they are public torch_npu APIs (TorchAir maps its traceable collectives onto the first two);
each must give on every rank what the math says, check its arguments as ProcessGroupHCCL does, and
leave one collective kernel per rank in the trace, under the kind HCCL's AIV tables name.
"""
import pytest
import torch
import torch.distributed as dist

import torch_npu
from pytest_npugraph.trace import Kernel

pytestmark = [pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning"),
              pytest.mark.filterwarnings("ignore:barrier\\(\\). using the device:UserWarning")]
WORLDS = [pytest.param(n, marks=pytest.mark.npu_devices(n), id=f"{n}ranks") for n in (2, 3)]


def data(rank, shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-8, 9, shape, generator=g).to(dtype)


def sizes_for(world):
    return [r + 1 for r in range(world)]        # rank r owns r + 1 rows


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_reduce_scatter_uneven_reduces_each_ranks_rows(npugraph, world, dtype):
    sizes = sizes_for(world)

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=world)
        out = torch.empty(sizes[rank], 3, dtype=dtype, device="npu")
        torch_npu.distributed.reduce_scatter_tensor_uneven(out, data(rank, (sum(sizes), 3), dtype).npu(), sizes)
        return out.cpu()

    results = npugraph.run_ranks(fn)
    total = sum(data(r, (sum(sizes), 3), dtype) for r in range(world))
    for rank, got in enumerate(results):
        start = sum(sizes[:rank])
        assert torch.equal(got, total[start:start + sizes[rank]])
    kernels = [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.collective]
    assert len(kernels) == world and {k.op for k in kernels} == {"hccl::reduce_scatter"}
    npugraph.assert_clean()


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_uneven_concatenates_the_ranks_rows(npugraph, world):
    sizes = sizes_for(world)

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=world)
        out = torch.empty(sum(sizes), 2, device="npu")
        work = torch_npu.distributed.all_gather_into_tensor_uneven(out, data(rank, (sizes[rank], 2)).npu(), sizes,
                                                                   async_op=True)
        work.wait()
        return out.cpu()

    expected = torch.cat([data(r, (sizes[r], 2)) for r in range(world)])
    assert all(torch.equal(got, expected) for got in npugraph.run_ranks(fn))
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_without_split_sizes_the_rows_split_evenly_and_avg_of_ints_truncates(npugraph):
    """Empty split sizes: equal rows (torch_npu's upstream tests call them so). AVG on integers:
    HCCL has no AVG; torch_npu sums and then divides the integer tensor in place (truncation)."""
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        out = torch.empty(2, dtype=torch.int32, device="npu")
        source = torch.tensor([1, 2, 3, 4], dtype=torch.int32, device="npu") * (rank + 1)
        torch_npu.distributed.reduce_scatter_tensor_uneven(out, source, op=dist.ReduceOp.AVG)
        gathered = torch.empty(4, dtype=torch.int32, device="npu")
        torch_npu.distributed.all_gather_into_tensor_uneven(gathered, out)
        return gathered.cpu().tolist()

    assert npugraph.run_ranks(fn) == [[1, 3, 4, 6]] * 2      # (1+2)/2, (2+4)/2, (3+6)/2, (4+8)/2 truncated


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_vc_moves_the_counts_of_the_matrix(npugraph, world):
    matrix = [[(i + 2 * j) % 3 + 1 for j in range(world)] for i in range(world)]     # elements i -> j

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=world)
        source = torch.arange(sum(matrix[rank]), dtype=torch.float32) + 100 * rank
        out = torch.empty(sum(row[rank] for row in matrix), device="npu")
        torch_npu.distributed.all_to_all_vc(out, source.npu(), matrix)
        return out.cpu()

    results = npugraph.run_ranks(fn)
    for j, got in enumerate(results):
        parts = []
        for i in range(world):
            start = sum(matrix[i][:j])
            parts.append(torch.arange(start, start + matrix[i][j], dtype=torch.float32) + 100 * i)
        assert torch.equal(got, torch.cat(parts))
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("call, message", [
    (lambda: torch_npu.distributed.reduce_scatter_tensor_uneven(
        torch.empty(1, device="npu"), torch.ones(3, device="npu")),
     "Tensor's dim 0 does not divide equally across group size"),
    (lambda: torch_npu.distributed.reduce_scatter_tensor_uneven(
        torch.empty(1, device="npu"), torch.ones(3, device="npu"), [1, 1]),
     "Split sizes doesn't match total dim 0 size"),
    (lambda: torch_npu.distributed.all_gather_into_tensor_uneven(
        torch.empty(3, device="npu"), torch.ones(1, device="npu"), [1, 1, 1]),
     "Number of tensor splits not equal to group size"),
    (lambda: torch_npu.distributed.all_gather_into_tensor_uneven(
        torch.empty(2, device="npu"), torch.ones(1, dtype=torch.int32, device="npu")),
     "output tensor must have the same type as input tensor"),
], ids=["indivisible", "sizes-sum", "sizes-count", "dtype"])
def test_bad_arguments_raise_process_group_hccls_errors_on_the_calling_rank(npugraph, call, message):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        with pytest.raises(RuntimeError, match=message):
            call()
        return True

    assert npugraph.run_ranks(fn) == [True, True]


@pytest.mark.npu_devices(2)
def test_all_to_all_vc_checks_the_matrix_shape(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        out = torch.empty(2, device="npu")
        with pytest.raises(ValueError, match=r"must have 2 rows \(group size\), got 1"):
            torch_npu.distributed.all_to_all_vc(out, out.clone(), [[1, 1]])
        with pytest.raises(ValueError, match=r"square \[2\]\[2\] matrix; got a row of length 1"):
            torch_npu.distributed.all_to_all_vc(out, out.clone(), [[1], [1, 1]])
        return True

    assert npugraph.run_ranks(fn) == [True, True]


def test_cpu_tensors_are_refused_with_torch_npus_warning(npugraph):
    with pytest.warns(UserWarning, match="Support for Tensors is limited to those of type npu"):
        assert torch_npu.distributed.all_gather_into_tensor_uneven(torch.empty(2), torch.ones(1)) is None
