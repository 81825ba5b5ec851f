"""MC2 fused collectives across ranks: the TP matmul collectives and MoE dispatch/combine v2.

Why: tensor-parallel layers call ``npu_mm_all_reduce_base`` (row-parallel linear),
``npu_all_gather_base_mm`` (sequence-parallel input) and ``npu_mm_reduce_scatter_base``
(sequence-parallel output) on the TP group's HCCL comm name; expert-parallel MoE calls the v2
dispatch/combine.  Each rank's result must equal the unsharded computation written here with
plain loops over the ranks' shards.
"""
import pytest
import torch
import torch.distributed as dist

import torch_npu
from pytest_npugraph.trace import Kernel

WORLDS = [pytest.param(n, marks=pytest.mark.npu_devices(n), id=f"{n}ranks") for n in (2, 4)]
M, K, N = 4, 6, 5


def shard(rank, *shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(100 * seed + rank))


def comm_name(rank):
    return dist.group.WORLD._get_backend(torch.device("npu")).get_hccl_comm_name(rank)


def _init(rank, world):
    dist.init_process_group("hccl", rank=rank, world_size=world)
    return comm_name(rank)


@pytest.mark.parametrize("world", WORLDS)
def test_mm_all_reduce_base_sums_the_ranks_partial_products(npugraph, world):
    def fn(rank):
        hcom = _init(rank, world)
        x1, x2, bias, x3 = shard(rank, M, K, seed=1), shard(rank, K, N, seed=2), shard(rank, N, seed=3), \
            shard(rank, M, N, seed=4)
        out = torch_npu.npu_mm_all_reduce_base(x1.npu(), x2.npu(), hcom, bias=bias.npu(), x3=x3.npu())
        return out.cpu()

    results = npugraph.run_ranks(fn)
    expected = torch.zeros(M, N)
    for r in range(world):
        x1, x2, bias, x3 = shard(r, M, K, seed=1), shard(r, K, N, seed=2), shard(r, N, seed=3), shard(r, M, N, seed=4)
        for i in range(M):
            for j in range(N):
                expected[i, j] += sum(x1[i, q].item() * x2[q, j].item() for q in range(K)) + bias[j] + x3[i, j]
    for out in results:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.npu_devices(2)
def test_mm_all_reduce_base_int8_dequant_and_pertoken(npugraph):
    def data(rank):
        g = torch.Generator().manual_seed(rank)
        return (torch.randint(-5, 5, (3, 4), generator=g, dtype=torch.int8),
                torch.randint(-5, 5, (4, 2), generator=g, dtype=torch.int8),
                torch.rand(2, generator=g), torch.rand(3, generator=g))

    def fn(rank):
        hcom = _init(rank, 2)
        x1, x2, dq, pt = data(rank)
        out = torch_npu.npu_mm_all_reduce_base(x1.npu(), x2.npu(), hcom, dequant_scale=dq.to(torch.bfloat16).npu(),
                                               pertoken_scale=pt.npu())
        return out.cpu()

    results = npugraph.run_ranks(fn)
    expected = torch.zeros(3, 2)
    for r in range(2):
        x1, x2, dq, pt = data(r)
        dq = dq.to(torch.bfloat16).float()
        for i in range(3):
            for j in range(2):
                expected[i, j] += sum(int(x1[i, q]) * int(x2[q, j]) for q in range(4)) * dq[j] * pt[i]
    for out in results:
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_base_mm_multiplies_the_gathered_rows(npugraph, world):
    def fn(rank):
        hcom = _init(rank, world)
        out, gathered = torch_npu.npu_all_gather_base_mm(shard(rank, 2, K, seed=5).npu(), shard(rank, K, N, seed=6).npu(),
                                                         hcom, world)
        return out.cpu(), gathered.cpu()

    results = npugraph.run_ranks(fn)
    rows = [shard(r, 2, K, seed=5) for r in range(world)]
    for rank, (out, gathered) in enumerate(results):
        assert gathered.shape == (2 * world, K)
        for r in range(world):
            assert torch.equal(gathered[2 * r:2 * r + 2], rows[r])
        x2 = shard(rank, K, N, seed=6)
        expected = [[sum(rows[i // 2][i % 2, q].item() * x2[q, j].item() for q in range(K)) for j in range(N)]
                    for i in range(2 * world)]
        torch.testing.assert_close(out, torch.tensor(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world", WORLDS)
def test_mm_reduce_scatter_base_keeps_each_ranks_rows_of_the_sum(npugraph, world):
    m = 2 * world

    def fn(rank):
        hcom = _init(rank, world)
        return torch_npu.npu_mm_reduce_scatter_base(shard(rank, m, K, seed=7).npu(), shard(rank, K, N, seed=8).npu(),
                                                    hcom, world).cpu()

    results = npugraph.run_ranks(fn)
    total = [[sum(sum(shard(r, m, K, seed=7)[i, q].item() * shard(r, K, N, seed=8)[q, j].item() for q in range(K))
                  for r in range(world)) for j in range(N)] for i in range(m)]
    for rank, out in enumerate(results):
        assert out.shape == (2, N)
        torch.testing.assert_close(out, torch.tensor(total[2 * rank:2 * rank + 2]), rtol=1e-5, atol=1e-5)


@pytest.mark.npu_devices(2)
def test_mc2_matmuls_are_recorded_as_mc2_collectives_of_the_group(npugraph):
    def fn(rank):
        hcom = _init(rank, 2)
        g = torch.Generator().manual_seed(rank)     # per rank: the rank threads share torch's global generator
        x = torch.randn(4, 8, generator=g).npu()
        w = torch.randn(8, 8, generator=torch.Generator().manual_seed(7)).npu()
        y = torch_npu.npu_mm_all_reduce_base(x, w, hcom)
        y, _ = torch_npu.npu_all_gather_base_mm(y, w, hcom, 2)
        return torch_npu.npu_mm_reduce_scatter_base(y, w, hcom, 2).cpu()

    npugraph.run_ranks(fn)
    trace = npugraph.trace
    mc2 = [r for r in trace.records if isinstance(r, Kernel) and r.collective is not None and r.op.startswith("npu::")]
    assert sorted((trace.streams[k.stream].device, k.op, k.collective[1]) for k in mc2) == sorted(
        (d, op, seq) for d in (0, 1) for seq, op in enumerate(
            ["npu::npu_mm_all_reduce_base", "npu::npu_all_gather_base_mm", "npu::npu_mm_reduce_scatter_base"]))
    for k in mc2:
        assert (k.cores.kind, k.cores.all_resident, k.cores.vector) == ("MC2", True, npugraph.vector_cores)
        assert k.reads and k.writes and k.site.path.endswith("test_mc2_family.py")
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_mc2_matmul_argument_errors(npugraph):
    def wrong_world(rank):
        hcom = _init(rank, 2)
        torch_npu.npu_all_gather_base_mm(torch.randn(2, 4).npu(), torch.randn(4, 4).npu(), hcom, 4)

    with pytest.raises(RuntimeError, match=r"world_size=4, but 'hccl/0' has 2 ranks"):
        npugraph.run_ranks(wrong_world)

    def wrong_group(rank):
        _init(rank, 2)
        torch_npu.npu_mm_reduce_scatter_base(torch.randn(2, 4).npu(), torch.randn(4, 4).npu(), "hcom_x", 2)

    with pytest.raises(RuntimeError, match=r"'hcom_x' is not an HCCL communicator of this rank"):
        npugraph.run_ranks(wrong_group)


def test_mc2_matmuls_on_one_device(npugraph):
    x, w, b = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)
    y = torch_npu.npu_mm_all_reduce_base(x.npu(), w.npu(), "hccl/0", bias=b.npu())   # a communicator of one
    torch.testing.assert_close(y.cpu(), x @ w + b)
    out, gathered = torch_npu.npu_all_gather_base_mm(x.npu(), w.npu(), "hccl/0", 1, gather_output=False)
    torch.testing.assert_close(out.cpu(), x @ w)
    assert gathered.shape == (0,)
    with pytest.raises(RuntimeError, match=r"world_size=2 needs 2 ranks: run the rank function with "
                                           r"npugraph.run_ranks"):
        torch_npu.npu_mm_reduce_scatter_base(x.npu(), w.npu(), "hccl/0", 2)


# ----------------------------------------------------------------------------- MoE dispatch / combine v2
TOKENS, HIDDEN, TOP_K, LOCAL = 5, 4, 2, 2


def routing(rank, experts):
    g = torch.Generator().manual_seed(rank + 10)
    x = torch.randn(TOKENS, HIDDEN, generator=g)
    ids = torch.stack([torch.randperm(experts, generator=g)[:TOP_K] for _ in range(TOKENS)]).to(torch.int32)
    return x, ids, torch.rand(TOKENS, TOP_K, generator=g)


def expert_weights(experts):
    return torch.randn(experts, HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(7)) / HIDDEN


@pytest.mark.parametrize("world", WORLDS)
def test_dispatch_v2_experts_combine_v2_round_trip_equals_the_local_moe(npugraph, world):
    experts = world * LOCAL

    def fn(rank):
        group_ep = _init(rank, world)
        x, ids, scales = routing(rank, experts)
        expand_x, _, assist, token_nums, recv, _, _ = torch_npu.npu_moe_distribute_dispatch_v2(
            x.npu(), ids.npu(), group_ep, world, rank, experts, expert_scales=scales.npu())
        w = expert_weights(experts)[rank * LOCAL:(rank + 1) * LOCAL]
        rows, start = [], 0
        for e, count in enumerate(token_nums.cpu().tolist()):
            rows.append(expand_x.cpu()[start:start + count] @ w[e])
            start += count
        expert_out = torch.zeros_like(expand_x.cpu())
        expert_out[:start] = torch.cat(rows)
        out = torch_npu.npu_moe_distribute_combine_v2(expert_out.npu(), ids.npu(), assist, recv, scales.npu(),
                                                      group_ep, world, rank, experts)
        return out.cpu(), assist.shape, recv.shape

    results = npugraph.run_ranks(fn)
    weights = expert_weights(experts)
    for rank, (out, assist_shape, recv_shape) in enumerate(results):
        x, ids, scales = routing(rank, experts)
        expected = torch.stack([sum(scales[t, j] * (x[t] @ weights[ids[t, j]]) for j in range(TOP_K))
                                for t in range(TOKENS)])
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        rows = TOKENS * world * min(LOCAL, TOP_K)
        assert assist_shape == (max(TOKENS * TOP_K, rows * 128),) and recv_shape == (world * LOCAL,)


def two_tp_collectives(rank, same_stream):
    """A row-parallel linear (all-reduce) and a sequence-parallel one (reduce-scatter) on two TP groups."""
    dist.init_process_group("hccl", rank=rank, world_size=2)
    names = [g._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
             for g in (dist.new_group([0, 1]), dist.new_group([0, 1]))]
    x, w = shard(rank, 4, 8, seed=9).npu(), shard(rank, 8, 8, seed=10).npu()
    main = torch.npu.current_stream()
    first, second = torch.npu.Stream(), torch.npu.Stream()
    for s in (first, second):
        s.wait_stream(main)
    with torch.npu.stream(first):
        y = torch_npu.npu_mm_all_reduce_base(x, w, names[0])
    with torch.npu.stream(first if same_stream else second):
        z = torch_npu.npu_mm_reduce_scatter_base(x, w, names[1], 2)
    for s in (first, second):
        main.wait_stream(s)
    return y.cpu(), z.cpu()


@pytest.mark.npu_devices(2)
def test_two_mc2_matmuls_on_unordered_streams_are_a_deadlock(npugraph):
    """Each MC2 kernel holds every vector core while it waits for its peer: if card 0 starts the
    all-reduce and card 1 the reduce-scatter, neither peer can ever start."""
    with npugraph.expect("deadlock", match=r"npu:0, npu:1 can block each other forever(.|\n)*"
                                           r"cause: .*npu::npu_mm_all_reduce_base 48"):
        npugraph.run_ranks(two_tp_collectives, False)


@pytest.mark.npu_devices(2)
def test_two_mc2_matmuls_in_one_stream_order_are_clean(npugraph):
    results = npugraph.run_ranks(two_tp_collectives, True)
    npugraph.assert_clean()
    partials = [shard(r, 4, 8, seed=9) @ shard(r, 8, 8, seed=10) for r in range(2)]
    for rank, (y, z) in enumerate(results):
        torch.testing.assert_close(y, partials[0] + partials[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(z, (partials[0] + partials[1])[2 * rank:2 * rank + 2], rtol=1e-5, atol=1e-5)
