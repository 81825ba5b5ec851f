"""Each ``run_ranks`` rank has its own CPU and NPU random generators, as each rank process has on
hardware (issue 24: rank threads shared torch's CPU generator, so a rank's draws depended on how the
threads interleaved: values differed between ranks and between runs).  The tests force the
interleavings that used to break them."""
import threading

import pytest
import torch
import torch_npu  # noqa: F401

from graph.helpers import backend
from pytest_npugraph.runtime.generators import DEFAULT_SEED

pytestmark = pytest.mark.npu_devices(2)


def reference(draw, seed=0):
    """What one process gets: seed, then ``draw`` (the calling thread's generator, restored after)."""
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        return draw()
    finally:
        torch.set_rng_state(state)


class Interleaving:
    """Rank 0 seeds and draws half its numbers, then rank 1 seeds and draws all of its own, then
    rank 0 draws the rest: the order in which a shared generator gave the ranks different numbers."""

    def __init__(self):
        self.half_drawn, self.seeded = threading.Event(), threading.Event()

    def __call__(self, rank, steps, draw, seed=0):
        if rank == 1:
            assert self.half_drawn.wait(30)
        torch.manual_seed(seed)
        out = []
        for i in range(steps):
            if rank == 0 and i == steps // 2:
                self.half_drawn.set()
                assert self.seeded.wait(30)
            out.append(draw())
        if rank == 1:
            self.seeded.set()
        return torch.cat([t.flatten() for t in out])


def test_every_rank_seeded_alike_draws_the_same_cpu_numbers(npugraph):
    draw = lambda: torch.randn(16)                                    # noqa: E731
    a, b = npugraph.run_ranks(Interleaving(), 6, draw)
    expected = reference(lambda: torch.cat([torch.randn(16) for _ in range(6)]))
    assert torch.equal(a, expected) and torch.equal(b, expected)


def test_every_rank_seeded_alike_draws_the_same_npu_numbers(npugraph):
    """torch.manual_seed seeds every NPU (torch_npu's manual_seed_all): rank 1's seed is its own
    process's and leaves the generator rank 0 draws from on npu:0 alone."""
    draw = lambda: torch.randn(8, device="npu").cpu()                 # noqa: E731
    a, b = npugraph.run_ranks(Interleaving(), 4, draw)
    assert torch.equal(a, b)


def test_modules_made_in_each_rank_after_the_same_seed_have_the_same_weights(npugraph):
    """nn.init draws with Tensor.uniform_; CPU dropout with the C++ kernel's default generator."""
    made, seeded = threading.Event(), threading.Event()

    def build(rank):
        if rank == 1:
            assert made.wait(30)
        torch.manual_seed(3)
        layer = torch.nn.Linear(8, 8)
        if rank == 0:
            made.set()
            assert seeded.wait(30)                  # rank 1 seeds and draws before rank 0's dropout
        dropped = torch.nn.functional.dropout(torch.ones(32), 0.5)
        if rank == 1:
            seeded.set()
        return torch.cat([layer.weight.detach().flatten(), layer.bias.detach(), dropped])
    a, b = npugraph.run_ranks(build)
    def one():
        layer = torch.nn.Linear(8, 8)
        return torch.cat([layer.weight.detach().flatten(), layer.bias.detach(),
                          torch.nn.functional.dropout(torch.ones(32), 0.5)])
    expected = reference(one, seed=3)
    assert torch.equal(a, expected) and torch.equal(b, expected)


def test_a_rank_starts_from_a_fresh_processs_seed_and_leaves_the_callers_generator_alone(npugraph):
    torch.manual_seed(5)
    before = torch.get_rng_state()
    seeds = npugraph.run_ranks(lambda rank: (torch.initial_seed(), torch.npu.initial_seed(), torch.randn(3).sum()))
    assert [s[:2] for s in seeds] == [(DEFAULT_SEED, DEFAULT_SEED)] * 2
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.initial_seed() == 5


def test_rng_state_and_fork_rng_in_a_rank_are_the_ranks(npugraph):
    def fn(rank):
        torch.manual_seed(rank)
        state = torch.get_rng_state()
        first = torch.rand(4)
        with torch.random.fork_rng(devices=[]):
            torch.rand(100)
        second = torch.rand(4)
        torch.set_rng_state(state)
        return first, second, torch.rand(4)
    for rank, (first, second, again) in enumerate(npugraph.run_ranks(fn)):
        expected = reference(lambda: torch.rand(8), seed=rank)
        assert torch.equal(torch.cat([first, second]), expected)
        assert torch.equal(again, first)


# ------------------------------------------------------------------ compiled graphs in rank threads
COMPILED = ["ge", "reduce-overhead", "npugraph_ex", "aot_eager", "eager"]


def _compiled(fn, mode):
    return torch.compile(fn, backend=mode if mode in ("aot_eager", "eager") else backend(mode), dynamic=False)


def _noisy(x):
    """CPU draws of every kind a compiled graph makes (a factory, a like-factory, dropout, an in-place
    sampler), used on the NPU."""
    noise = torch.randn(8) + torch.rand_like(torch.ones(8)) + torch.nn.functional.dropout(torch.ones(8), 0.5)
    noise = noise + torch.empty(8).uniform_(-1, 1)
    return x * 2 + noise.to(x.device)


@pytest.mark.parametrize("mode", COMPILED)
def test_a_compiled_graph_in_every_rank_seeded_alike_draws_the_same_cpu_numbers(npugraph, mode):
    """A compiled graph calls aten ops, past the torch functions a rank thread wraps: it draws from
    the rank's CPU generator all the same, in every backend, as a rank process would."""
    step = _compiled(_noisy, mode)
    draw = lambda: step(torch.ones(8, device="npu")).cpu()          # noqa: E731
    a, b = npugraph.run_ranks(Interleaving(), 5, draw)
    expected = reference(lambda: torch.cat([draw() for _ in range(5)]))
    assert torch.equal(a, b) and torch.equal(a, expected)
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", ["ge", "aot_eager"])
def test_a_compiled_graph_in_a_rank_draws_npu_numbers_from_the_ranks_device_generator(npugraph, mode):
    """NPU dropout inside the graph: the rank's npu:r generator, seeded by the rank's manual_seed;
    CPU draws beside it still come from the rank's CPU generator."""
    def fn(x):
        return torch.nn.functional.dropout(x, 0.5) + torch.randn(8).to(x.device)
    step = _compiled(fn, mode)
    draw = lambda: step(torch.ones(8, device="npu")).cpu()          # noqa: E731
    a, b = npugraph.run_ranks(Interleaving(), 4, draw)
    assert torch.equal(a, b)
    assert not torch.equal(a[:8], a[8:16])                          # later steps draw further


def test_a_rank_whose_compiled_graph_waits_for_the_other_rank_does_not_hold_up_its_draws(npugraph):
    """The swap is per op, never across a graph: rank 0's graph reads an all_reduce's result (the
    host waits for rank 1 to issue it) while rank 1 still has numbers to draw."""
    import torch.distributed as dist

    def fn(x):
        return x.cpu() + torch.randn(8)
    step = _compiled(fn, "aot_eager")
    entered = threading.Event()

    def body(rank):
        dist.init_process_group("hccl")
        torch.manual_seed(0)
        x = torch.full((8,), rank + 1.0, device="npu")
        if rank == 1:
            assert entered.wait(30)
            drawn = torch.randn(8)
        dist.all_reduce(x)
        if rank == 0:
            entered.set()
            drawn = torch.randn(8)
        return step(x), drawn
    (a, drawn_a), (b, drawn_b) = npugraph.run_ranks(body)
    first, second = reference(lambda: (torch.randn(8), torch.randn(8)))
    assert torch.equal(drawn_a, first) and torch.equal(drawn_b, first)
    torch.testing.assert_close(a, 3 + second)
    torch.testing.assert_close(b, 3 + second)
    npugraph.assert_clean()
