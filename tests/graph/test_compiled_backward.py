"""Training through compiled regions (issue 24, item 6, compiled code): ``loss.backward()`` after a
``torch.compile``d forward works in every backend, with the values eager gives on the CPU, and the
compiled backward (one autograd node) runs on its forward's stream with the engine's syncs, so
torch's documented backward-on-a-side-stream patterns are clean and the undocumented one races."""
import copy

import pytest
import torch
import torch_npu  # noqa: F401
import torchair

from pytest_npugraph import trace as T

from eager.autograd_helpers import backward_streams, data, expected_grads, loss_of, side

from .helpers import backend

MODES = ["ge", "reduce-overhead", "npugraph_ex", "aot_eager"]
STREAM_MODES = ["reduce-overhead", "npugraph_ex", "aot_eager"]   # GE runs its ops on the graph's own lanes


def compiled(fn, mode):
    return torch.compile(fn, backend="aot_eager" if mode == "aot_eager" else backend(mode), dynamic=False)


# --------------------------------------------------------------------------------- values
@pytest.mark.parametrize("mode", MODES)
def test_backward_of_a_compiled_function_gives_eagers_gradients(npugraph, mode):
    x, w = data()
    loss = compiled(loss_of, mode)(x, w)
    loss.backward()
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    npugraph.assert_clean()


def _train(model, step, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 4, generator=g).to(device)
        loss = step(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("mode", MODES)
def test_training_steps_through_a_compiled_model_match_eager_on_the_cpu(npugraph, mode):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    npu = copy.deepcopy(cpu).npu()
    npu_losses = _train(npu, compiled(npu, mode))
    cpu_losses = _train(cpu, cpu)
    assert npu_losses == pytest.approx(cpu_losses, rel=1e-5, abs=1e-6)
    for a, b in zip(npu.parameters(), cpu.parameters()):
        assert a.device.type == "npu" and a.grad is None
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_backward_through_one_of_two_compiled_outputs(npugraph, mode):
    """The unused output's tangent is made by AOTAutograd (zeros); the used one is the NPU gradient."""
    def two(x, w):
        return (x @ w).relu(), (x * w).sigmoid()
    x, w = data()
    a, b = compiled(two, mode)(x, w)
    a.backward(torch.ones_like(a))
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("mode", MODES)
def test_backward_of_a_compiled_function_on_npu1(npugraph, mode):
    with torch.npu.device(1):
        x, w = data()
        loss = compiled(loss_of, mode)(x, w)
        loss.backward()
    assert x.grad.device == torch.device("npu:1") and w.grad.device == torch.device("npu:1")
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    assert all(label.startswith("npu:1/") for label in backward_streams(npugraph, "threshold_backward"))
    npugraph.assert_clean()


# --------------------------------------------------------------------------------- streams
@pytest.mark.parametrize("mode", MODES)
def test_grads_used_in_the_stream_context_of_a_compiled_backward_are_clean(npugraph, mode):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = compiled(loss_of, mode)(x, w)
        loss.backward()
        z = x.grad * 2                               # torch's "safe" pattern
    torch.npu.current_stream().wait_stream(s)
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(z.cpu(), gx * 2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    if mode in STREAM_MODES:
        assert backward_streams(npugraph, "threshold_backward") == {"npu:0/stream-0"}
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_compiled_backward_runs_on_its_forwards_stream_and_syncs_with_the_caller(npugraph, mode):
    x, w = data()
    loss = compiled(loss_of, mode)(x, w)             # forward on the default stream
    s = side()
    with torch.npu.stream(s):
        loss.backward()
        z = w.grad + 1
    torch.npu.current_stream().wait_stream(s)
    torch.testing.assert_close(z.cpu(), expected_grads(x, w)[1] + 1, rtol=1e-5, atol=1e-5)
    if mode in STREAM_MODES:
        assert backward_streams(npugraph, "threshold_backward") == {"npu:0/default"}
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_grads_of_a_compiled_backward_used_on_another_stream_without_sync_race(npugraph, mode):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = compiled(loss_of, mode)(x, w)
        loss.backward()
    with npugraph.expect("race"):
        x.grad * 2                                   # torch's "unsafe" pattern: on the default stream
    torch.npu.synchronize()


@pytest.mark.parametrize("mode", MODES)
def test_grads_of_a_compiled_backward_used_after_wait_stream_are_clean(npugraph, mode):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = compiled(loss_of, mode)(x, w)
        loss.backward()
    torch.npu.current_stream().wait_stream(s)        # torch's "safe, with synchronization"
    z = x.grad * 2
    torch.testing.assert_close(z.cpu(), expected_grads(x, w)[0] * 2, rtol=1e-5, atol=1e-5)
    npugraph.assert_clean()


def test_compiled_and_eager_regions_on_two_streams_sync_as_the_engine_does(npugraph):
    """A compiled region on ``s1`` feeds an eager op on ``s2``: the compiled backward node runs on
    ``s1`` after the eager backward on ``s2`` (the engine's producer/consumer sync)."""
    x, w = data()
    main = torch.npu.current_stream()
    s1, s2 = side(), side()
    with torch.npu.stream(s1):
        a = compiled(lambda x, w: (x @ w).relu(), "aot_eager")(x, w)
    s2.wait_stream(s1)
    with torch.npu.stream(s2):
        b = (a * 3).sigmoid().sum()
    main.wait_stream(s2)
    b.backward()
    z = x.grad + w.grad
    xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    ((xc @ wc).relu() * 3).sigmoid().sum().backward()
    torch.testing.assert_close(z.cpu(), xc.grad + wc.grad, rtol=1e-5, atol=1e-5)
    assert backward_streams(npugraph, "threshold_backward") == {"npu:0/stream-0"}
    assert backward_streams(npugraph, "sigmoid_backward") == {"npu:0/stream-1"}
    npugraph.assert_clean()


# --------------------------------------------------------------------------------- captured
@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_the_backward_graph_is_captured_and_replayed_as_the_forward(npugraph, mode):
    """TorchAir compiles the backward graph with the same compiler: in the aclgraph modes it is
    captured once and replayed on each later step, with right gradients on every step."""
    step = compiled(loss_of, mode)
    for i in range(3):
        x, w = data()
        with torch.no_grad():
            x.mul_(i + 1)
        step(x, w).backward()
        gx, gw = expected_grads(x, w)
        torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    replayed = [k for k in npugraph.trace.records
                if isinstance(k, T.Kernel) and "threshold_backward" in k.op and k.graph is not None]
    assert {k.graph.replay for k in replayed} == {0, 1, 2, 3}       # captured, then replayed each step
    npugraph.assert_clean()


def test_compiled_forward_and_backward_inside_a_capture_are_captured(npugraph):
    x, w = data()
    step = compiled(loss_of, "aot_eager")
    step(x, w)                                        # compile outside the capture (as torch requires)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        loss = step(x, w)
        gx, gw = torch.autograd.grad(loss, (x, w))
    g.replay()
    ex, ew = expected_grads(x, w)
    torch.testing.assert_close(gx.cpu(), ex, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw.cpu(), ew, rtol=1e-5, atol=1e-5)
    captured = [k for k in npugraph.trace.records if isinstance(k, T.Kernel) and "threshold_backward" in k.op]
    assert captured and all(k.graph is not None for k in captured)
    npugraph.assert_clean()


class _DropoutNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x):
        return self.l2(self.drop(torch.nn.functional.gelu(self.ln(self.l1(x)))))


@pytest.mark.parametrize("mode", MODES)
def test_dropout_in_a_compiled_training_step_draws_as_eager_after_the_same_npu_seed(npugraph, mode):
    torch.manual_seed(0)
    net = _DropoutNet().npu()
    eager = copy.deepcopy(net)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)).npu()
    outs = []
    for model in (compiled(net, mode), eager):
        torch.npu.manual_seed(5)
        y = model(x)
        y.square().mean().backward()
        outs.append(y.detach().cpu())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    for a, b in zip(net.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad.cpu(), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(eager.eval()(x).cpu(), outs[1])    # the dropout did drop
    npugraph.assert_clean()


# --------------------------------------------------------------------------------- streams inside
# A stream scope inside a compiled function that is trained through.  torch 2.13's AOTAutograd then
# runs its stream pass, whose cost estimate asks the device's memory bandwidth (answered for the
# emulated NPU: runtime/aot_stream_estimate.py; it asked triton).  What each backend does with the
# scope is its own: TorchAir's aclgraph modes run the forward's scope on its stream inside the
# captured graph, and the backward graph (which has no scope) on the calling stream; GE runs every op
# on its graph's lanes; aot_eager runs the graph on the current stream (torch honours stream
# annotations only in inductor's code).
def in_a_stream(s):
    def step(x, w):
        with torch.npu.stream(s):
            return loss_of(x, w)
    return step


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_scope_inside_a_compiled_training_step_gives_eagers_gradients(npugraph, mode):
    x, w = data()
    s = side()
    loss = compiled(in_a_stream(s), mode)(x, w)
    torch.npu.current_stream().wait_stream(s)        # the loss was made on s
    loss.backward()
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    if mode in ("reduce-overhead", "npugraph_ex"):
        assert backward_streams(npugraph, "aten::relu") == {"npu:0/stream-0"}
        assert backward_streams(npugraph, "threshold_backward") == {"npu:0/default"}
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex", "aot_eager"])
def test_events_inside_a_compiled_training_step(npugraph, mode):
    """An event recorded in the scope and waited on after it.  (GE: torch 2.13's default partitioner
    copies the forward's event record and wait into the backward graph, where the stream they name,
    Dynamo's weak reference to the forward's current stream, is gone: 'User object is no longer
    alive', on any device.)"""
    def step(x, w):
        with torch.npu.stream(s):
            y = (x @ w).relu()
            done = torch.npu.Event()
            done.record()
        done.wait()
        return y.sum()
    x, w = data()
    s = side()
    compiled(step, mode)(x, w).backward()
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_wait_stream_inside_a_compiled_training_step(npugraph, mode):
    def step(x, w):
        with torch.npu.stream(s):
            y = (x @ w).relu()
        torch.npu.current_stream().wait_stream(s)
        return y.sum()
    x, w = data()
    s = side()
    compiled(step, mode)(x, w).backward()
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    npugraph.assert_clean()


def test_wait_stream_inside_a_compiled_training_step_is_torchs_partitioner_error_in_aot_eager(npugraph):
    """torch 2.13's stream pass threads every later input of the waiting stream through the
    wait_stream's control dependency, the backward's tangent among them, so the forward's output
    depends on a tangent and the partitioner refuses the graph (any device; pytorch/pytorch#187695
    reworks that handling).  The emulator leaves torch's error as it is, not a triton one."""
    def step(x, w):
        with torch.npu.stream(s):
            y = (x @ w).relu()
        torch.npu.current_stream().wait_stream(s)
        return y.sum()
    x, w = data()
    s = side()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="was invalid, but is output"):
        compiled(step, "aot_eager")(x, w)


def switched(x, w, events=None):
    y = x @ w
    if events:
        torchair.ops.npu_tagged_event_record(events[0])
    with torchair.scope.npu_stream_switch("7"):
        if events:
            torchair.ops.npu_tagged_event_wait(events[0])
        z = y.relu()
        if events:
            torchair.ops.npu_tagged_event_record(events[1])
    if events:
        torchair.ops.npu_tagged_event_wait(events[1])
    return z.sum()


@pytest.mark.parametrize("mode", ["ge", "reduce-overhead", "npugraph_ex"])
def test_npu_stream_switch_with_tagged_events_in_a_compiled_training_step_is_clean(npugraph, mode):
    """TorchAir's documented pattern: in the aclgraph modes a stream scope's data edges are ordered
    with tagged events (GE orders them itself)."""
    events = (torchair.ops.npu_create_tagged_event(tag="in"), torchair.ops.npu_create_tagged_event(tag="out"))
    x, w = data()
    step = switched if mode == "ge" else (lambda x, w: switched(x, w, events))
    compiled(step, mode)(x, w).backward()
    gx, gw = expected_grads(x, w)
    torch.testing.assert_close(x.grad.cpu(), gx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), gw, rtol=1e-5, atol=1e-5)
    relu = backward_streams(npugraph, "aten::relu")
    assert len(relu) == 1 and "tag '7'" in relu.pop()
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_npu_stream_switch_without_tagged_events_in_a_compiled_training_step_races(npugraph, mode):
    x, w = data()
    with npugraph.expect("race", match="aten::relu"):
        compiled(switched, mode)(x, w).backward()
        torch.npu.synchronize()
