"""The NPU ops with random math draw from their device's generator (issue 24, item 7), never the CPU's.

``npu_fusion_attention`` with ``keep_prob < 1`` is the one op with random math (its dropout mask
comes from a seed and offset it draws and returns; the grad regenerates the mask from them).  The
math reads torch's default generator; the dispatcher runs every ``nondeterministic_seeded`` op with
that generator holding its device's NPU state (``runtime.generators.drawing``), in eager code, in
graph capture and replay and in compiled graphs.  These tests pin what that gives the user: seeding
the NPU makes the dropout reproducible, per device, without moving the CPU's random stream, and a
captured or compiled call draws what the eager call draws after the same seed."""
import pytest
import torch
import torch_npu
import torchair


def backend(mode):
    if mode == "npugraph_ex":
        return mode
    config = torchair.CompilerConfig()
    config.mode = mode
    return torchair.get_npu_backend(compiler_config=config)


def query(device="npu"):
    return torch.randn(1, 6, 2, 8, generator=torch.Generator().manual_seed(3)).to(device)


def attention(q, keep_prob=0.5):
    return torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", scale=0.3, keep_prob=keep_prob)


def cpu_stream():
    """The CPU generator's next numbers, without drawing them."""
    state = torch.get_rng_state()
    values = torch.randn(4)
    torch.set_rng_state(state)
    return values


def test_npu_seed_makes_the_dropout_reproducible_and_leaves_the_cpu_stream_alone(npugraph):
    q = query()
    torch.manual_seed(0)
    before = cpu_stream()
    torch.npu.manual_seed(4)
    first = [attention(q) for _ in range(2)]
    assert torch.equal(cpu_stream(), before)                        # the NPU's draws left the CPU alone
    torch.manual_seed(123)                                          # the CPU's seed plays no part ...
    torch.npu.manual_seed(4)                                        # ... the NPU's does
    again = [attention(q) for _ in range(2)]
    for a, b in zip(first, again):
        assert torch.equal(a[0].cpu(), b[0].cpu()) and a[4:6] == b[4:6]
    assert not torch.equal(first[0][0].cpu(), first[1][0].cpu())   # each call draws on
    assert first[0][4] == torch.npu.initial_seed() == 4             # the seed it returns is the NPU's
    no_dropout = attention(q, keep_prob=1.0)
    assert no_dropout[4:6] == (0, 0)


@pytest.mark.npu_devices(2)
def test_each_device_draws_from_its_own_generator(npugraph):
    q0, q1 = query("npu:0"), query("npu:1")
    torch.npu.manual_seed_all(4)
    on0 = attention(q0)[0].cpu()
    torch.npu.manual_seed_all(4)
    for _ in range(3):
        attention(q0)                                               # npu:0's draws leave npu:1's state
    on1 = attention(q1)[0].cpu()
    assert torch.equal(on0, on1)
    with torch.npu.device(1):
        torch.npu.manual_seed(9)                                    # reseeding npu:1 only
    torch.npu.manual_seed_all(4)
    assert torch.equal(attention(q0)[0].cpu(), on0)


def test_a_captured_call_draws_nothing_and_each_replay_draws_as_the_eager_calls(npugraph):
    q = query()
    torch.npu.manual_seed(4)
    eager = [attention(q)[0].cpu() for _ in range(3)]
    torch.npu.manual_seed(4)
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        out = attention(q)[0]
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(out.cpu())
    assert all(torch.equal(e, r) for e, r in zip(eager, replays))


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead", "npugraph_ex"])
def test_a_compiled_call_draws_as_the_eager_call(npugraph, mode):
    torch._dynamo.reset()
    step = torch.compile(lambda q: attention(q)[0] * 1, backend=backend(mode), dynamic=False)
    q = query()
    torch.npu.manual_seed(4)
    eager = [attention(q)[0].cpu() for _ in range(3)]
    torch.manual_seed(0)
    before = cpu_stream()
    torch.npu.manual_seed(4)
    compiled = [step(q).cpu() for _ in range(3)]
    assert torch.equal(cpu_stream(), before)
    assert all(torch.equal(e, c) for e, c in zip(eager, compiled))
    torch._dynamo.reset()
