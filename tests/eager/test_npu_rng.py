"""One generator per device (issue 24, item 7): ``torch.npu.manual_seed``/``manual_seed_all``/``seed``,
``get_rng_state``/``set_rng_state`` (per device and ``_all``), per-device ``torch.Generator`` and
``default_generators``, never touching the CPU's generator; captured and replayed as torch_npu does."""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph.runtime.generators import DEFAULT_SEED


def cpu_draw():
    state = torch.get_rng_state()
    value = torch.randn(4)
    torch.set_rng_state(state)
    return value


@pytest.mark.parametrize("seed_npu", [lambda: torch.npu.manual_seed(7), lambda: torch.npu.manual_seed_all(7),
                                      torch.npu.seed, torch.npu.seed_all,
                                      lambda: torch.npu.set_rng_state(torch.Generator().manual_seed(3).get_state())],
                         ids=["manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state"])
def test_seeding_the_npu_leaves_the_cpu_generator_alone(npugraph, seed_npu):
    torch.manual_seed(0)
    before = cpu_draw()
    seed_npu()
    torch.randn(8, device="npu")                     # drawing on the NPU too
    assert torch.equal(torch.randn(4), before)


def test_torch_manual_seed_seeds_the_cpu_and_every_npu_alike(npugraph):
    torch.manual_seed(11)
    npu = torch.randn(6, device="npu").cpu()
    torch.manual_seed(11)
    assert torch.equal(torch.randn(6, device="npu").cpu(), npu)
    assert torch.npu.initial_seed() == torch.initial_seed() == 11


def test_a_fresh_test_starts_from_the_default_seed(npugraph):
    assert torch.npu.initial_seed() == DEFAULT_SEED
    assert torch.npu.default_generators[0].initial_seed() == DEFAULT_SEED


@pytest.mark.npu_devices(2)
def test_each_device_has_its_own_generator(npugraph):
    torch.npu.manual_seed_all(5)
    a0 = torch.randn(4, device="npu:0").cpu()
    a1 = torch.randn(4, device="npu:1").cpu()
    assert torch.equal(a0, a1)                       # same seed, each its own sequence
    state1 = torch.npu.get_rng_state(1)
    torch.randn(100, device="npu:0")                 # draws on npu:0 leave npu:1 where it was
    assert torch.equal(torch.npu.get_rng_state("npu:1"), state1)
    with torch.npu.device(1):
        torch.npu.manual_seed(9)                     # the current device only
        assert torch.npu.initial_seed() == 9
    assert torch.npu.initial_seed() == 5
    gens = torch.npu.default_generators
    assert [g.device for g in gens] == [torch.device("npu:0"), torch.device("npu:1")]
    assert [g.initial_seed() for g in gens] == [5, 9]


@pytest.mark.npu_devices(2)
def test_get_and_set_rng_state_per_device_and_all(npugraph):
    torch.npu.manual_seed_all(1)
    states = torch.npu.get_rng_state_all()
    first = [torch.rand(5, device=f"npu:{i}").cpu() for i in range(2)]
    torch.npu.set_rng_state_all(states)
    assert all(torch.equal(torch.rand(5, device=f"npu:{i}").cpu(), first[i]) for i in range(2))
    torch.npu.set_rng_state(states[1], device=1)
    assert torch.equal(torch.rand(5, device="npu:1").cpu(), first[1])
    dropout = torch.nn.functional.dropout(torch.ones(64, device="npu:1"), 0.5)   # native_dropout: no generator arg
    torch.npu.set_rng_state(states[1], device=1)
    torch.rand(5, device="npu:1")
    assert torch.equal(torch.nn.functional.dropout(torch.ones(64, device="npu:1"), 0.5).cpu(), dropout.cpu())


@pytest.mark.npu_devices(2)
def test_a_per_device_generator(npugraph):
    g = torch.Generator(device="npu:1")
    assert g.device == torch.device("npu:1") and isinstance(g, torch.Generator)
    assert g.initial_seed() == DEFAULT_SEED
    before = torch.npu.get_rng_state(1)
    g.manual_seed(4)
    x = torch.randn(4, device="npu:1", generator=g).cpu()
    g.manual_seed(4)
    assert torch.equal(torch.randn(4, device="npu:1", generator=g).cpu(), x)
    assert torch.equal(torch.npu.get_rng_state(1), before)          # the default generator untouched
    assert torch.Generator(device="npu").device == torch.device("npu:0")


def test_a_random_op_queued_behind_a_wait_draws_the_numbers_of_its_issue(npugraph):
    """Hardware reserves a random op's numbers when the host issues it, whenever the stream runs it."""
    torch.npu.manual_seed(3)
    expected = [torch.rand(4, device="npu").cpu(), torch.rand(4, device="npu").cpu()]
    torch.npu.manual_seed(3)
    gate, side = torch.npu.ExternalEvent(), torch.npu.Stream()
    gate.wait(side)                                  # holds the side stream
    with torch.npu.stream(side):
        first = torch.rand(4, device="npu")          # queued: runs after the record below
    second = torch.rand(4, device="npu")             # runs at once on the default stream
    gate.record()
    torch.npu.synchronize()
    assert torch.equal(first.cpu(), expected[0]) and torch.equal(second.cpu(), expected[1])


# ------------------------------------------------------------------------------ graphs
def test_a_capture_draws_nothing_and_each_replay_draws_on(npugraph):
    torch.npu.manual_seed(2)
    eager = [torch.rand(4, device="npu").cpu() for _ in range(2)]
    torch.npu.manual_seed(2)
    g = torch.npu.NPUGraph()
    state = torch.npu.get_rng_state()
    with torch.npu.graph(g):
        out = torch.rand(4, device="npu")
    assert torch.equal(torch.npu.get_rng_state(), state)
    g.replay()
    assert torch.equal(out.cpu(), eager[0])
    g.replay()
    assert torch.equal(out.cpu(), eager[1])


def test_set_rng_state_inside_a_capture_is_replayed(npugraph):
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        state = torch.npu.get_rng_state()
        a = torch.rand(4, device="npu")
        torch.npu.set_rng_state(state)
        b = torch.rand(4, device="npu")
    seen = []
    for _ in range(2):
        g.replay()
        assert torch.equal(a.cpu(), b.cpu())         # the state read in the replay, set back
        seen.append(a.cpu())
    assert not torch.equal(seen[0], seen[1])         # each replay reads the generator where it stands


def test_seeding_during_a_capture_keeps_the_seed(npugraph):
    torch.npu.manual_seed(1)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.npu.manual_seed(1)                     # the same seed: allowed
        with pytest.raises(RuntimeError, match="only if new seed is the same as the original seed"):
            torch.npu.manual_seed(2)


def test_graph_checkpoint_preserve_rng_state(npugraph):
    """torch_npu's own test (test_graph_checkpoint_preserve_rng_state): activation checkpointing with
    ``preserve_rng_state`` inside a capture recomputes with the forward's random numbers."""
    torch.npu.manual_seed(42)

    def fn(x):
        return x * torch.sigmoid(torch.randn(1, device="npu"))

    fn(torch.ones(1, device="npu"))
    torch.npu.manual_seed(42)
    eager_in = torch.ones(1, device="npu", requires_grad=True)
    eager_out = torch.utils.checkpoint.checkpoint(fn, eager_in, use_reentrant=False, preserve_rng_state=True)
    (eager_in_grad,) = torch.autograd.grad(eager_out, eager_in)

    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        graph_in = torch.ones(1, device="npu", requires_grad=True)
        graph_out = torch.utils.checkpoint.checkpoint(fn, graph_in, use_reentrant=False, preserve_rng_state=True)
        (graph_in_grad,) = torch.autograd.grad(graph_out, graph_in)

    torch.npu.manual_seed(42)
    g.replay()
    assert torch.equal(eager_in_grad.cpu(), graph_in_grad.cpu())
    npugraph.assert_clean()
