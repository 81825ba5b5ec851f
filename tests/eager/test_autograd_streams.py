"""Autograd's streams (issue 24, item 6): each backward op runs on the stream of its forward op, with
the syncs torch's engine documents (torch notes/cuda.rst, "Stream semantics of backward passes"):
the backward call syncs with the caller's current stream for the initial gradient, producer and
consumer nodes on different streams are synced, and the caller's stream waits for the leaf gradients.
The documented safe patterns are clean with right values; the documented unsafe ones race."""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T

from .autograd_helpers import backward_streams, data, expected_grads, side


# --------------------------------------------------------------- the documented patterns
def test_grads_used_in_the_stream_context_of_backward_are_clean(npugraph):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = (x @ w).relu().sum()
        loss.backward()
        z = x.grad * 2                               # torch's "safe" pattern
    torch.npu.current_stream().wait_stream(s)
    gx, gw = expected_grads(x, w)
    assert torch.allclose(z.cpu(), gx * 2, atol=1e-5) and torch.allclose(w.grad.cpu(), gw, atol=1e-5)
    assert backward_streams(npugraph, "threshold_backward") == {"npu:0/stream-0"}
    npugraph.assert_clean()


def test_backward_ops_run_on_the_forward_ops_stream_and_sync_with_the_caller(npugraph):
    """Forward on the default stream, backward called inside ``s``: the backward ops run on the default
    stream (their forward's), ordered after the initial gradient made on ``s`` and before ``s`` goes on."""
    x, w = data()
    loss = (x @ w).relu().sum()
    s = side()
    with torch.npu.stream(s):
        loss.backward()
        z = w.grad + 1
    torch.npu.current_stream().wait_stream(s)
    _, gw = expected_grads(x, w)
    assert torch.allclose(z.cpu(), gw + 1, atol=1e-5)
    assert backward_streams(npugraph, "threshold_backward") == {"npu:0/default"}
    npugraph.assert_clean()


def test_grads_used_on_another_stream_without_sync_race(npugraph):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = (x @ w).relu().sum()
        loss.backward()
    with npugraph.expect("race"):
        x.grad * 2                                   # torch's "unsafe" pattern: on the default stream
    torch.npu.synchronize()


def test_grads_used_on_another_stream_after_wait_stream_are_clean(npugraph):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = (x @ w).relu().sum()
        loss.backward()
    torch.npu.current_stream().wait_stream(s)        # torch's "safe, with synchronization"
    z = x.grad * 2
    gx, _ = expected_grads(x, w)
    assert torch.allclose(z.cpu(), gx * 2, atol=1e-5)
    npugraph.assert_clean()


def test_initial_gradient_made_in_the_backward_stream_context_is_clean(npugraph):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = (x @ w).relu().sum()
        loss.backward(gradient=torch.ones_like(loss))
        z = x.grad.sum()
    torch.npu.current_stream().wait_stream(s)
    assert torch.allclose(z.cpu(), expected_grads(x, w)[0].sum(), atol=1e-4)
    npugraph.assert_clean()


def test_initial_gradient_made_on_another_stream_without_sync_races(npugraph):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = (x @ w).relu().sum()
    torch.npu.current_stream().wait_stream(s)
    initial = torch.ones_like(loss)                  # on the default stream
    with npugraph.expect("race"):
        with torch.npu.stream(s):
            loss.backward(gradient=initial)          # torch's "unsafe": backward on s reads it unsynced
    torch.npu.synchronize()


def test_initial_gradient_made_on_another_stream_with_sync_is_clean(npugraph):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        loss = (x @ w).relu().sum()
    torch.npu.current_stream().wait_stream(s)
    initial = torch.ones_like(loss)
    s.wait_stream(torch.npu.current_stream())        # torch's "safe, with synchronization"
    with torch.npu.stream(s):
        initial.record_stream(s)
        loss.backward(gradient=initial)
        z = x.grad.sum()
    torch.npu.current_stream().wait_stream(s)
    assert torch.allclose(z.cpu(), expected_grads(x, w)[0].sum(), atol=1e-4)
    npugraph.assert_clean()


# ----------------------------------------------------------------------- multi-stream
def test_branches_on_two_streams_run_backward_on_their_streams_with_the_engines_syncs(npugraph):
    x, w = data()
    main = torch.npu.current_stream()
    s1, s2 = side(), side()
    with torch.npu.stream(s1):
        a = (x @ w).relu()
    with torch.npu.stream(s2):
        b = (x * 3).sigmoid()
    main.wait_stream(s1)
    main.wait_stream(s2)
    loss = (a.sum() + b.sum())
    loss.backward()
    z = x.grad + w.grad                              # the caller's stream: after every leaf stream
    xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    ((xc @ wc).relu().sum() + (xc * 3).sigmoid().sum()).backward()
    assert torch.allclose(z.cpu(), xc.grad + wc.grad, atol=1e-5)
    assert backward_streams(npugraph, "threshold_backward") == {"npu:0/stream-0"}
    assert backward_streams(npugraph, "sigmoid_backward") == {"npu:0/stream-1"}
    npugraph.assert_clean()


def test_autograd_grad_and_gradient_accumulation_on_a_side_stream(npugraph):
    x, w = data()
    s = side()
    with torch.npu.stream(s):
        for _ in range(2):                           # .grad accumulates (AccumulateGrad adds on s)
            ((x @ w).relu().sum()).backward()
        (gx,) = torch.autograd.grad((x * w).sum(), x)
        z = x.grad + gx
    torch.npu.current_stream().wait_stream(s)
    assert torch.allclose(z.cpu(), 2 * expected_grads(x, w)[0] + w.detach().cpu(), atol=1e-4)
    npugraph.assert_clean()


def test_backward_work_is_attributed_to_the_backward_call(npugraph):
    x, w = data()
    loss = (x @ w).relu().sum()
    loss.backward()                                  # the line backward kernels report
    line = next(i for i, text in enumerate(open(__file__), 1) if "the line backward kernels report" in text)
    sites = {str(k.site) for k in npugraph.trace.records if isinstance(k, T.Kernel) and "threshold_backward" in k.op}
    assert sites == {f"tests/eager/test_autograd_streams.py:{line}"}


@pytest.mark.npu_devices(2)
def test_backward_on_npu1_runs_on_npu1s_streams(npugraph):
    with torch.npu.device(1):
        x, w = data()
        s = side()
        with torch.npu.stream(s):
            loss = (x @ w).relu().sum()
            loss.backward()
            z = w.grad * 1
        torch.npu.current_stream().wait_stream(s)
    assert torch.allclose(z.cpu(), expected_grads(x, w)[1], atol=1e-5)
    assert backward_streams(npugraph, "threshold_backward") == {"npu:1/stream-0"}
    npugraph.assert_clean()


# --------------------------------------------------------------------------- captured
def test_backward_inside_a_capture_is_captured(npugraph):
    x, w = data()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        loss = (x @ w).relu().sum()
        gx, gw = torch.autograd.grad(loss, (x, w))
    g.replay()
    ex, ew = expected_grads(x, w)
    assert torch.allclose(gx.cpu(), ex, atol=1e-5) and torch.allclose(gw.cpu(), ew, atol=1e-5)
    captured = [k for k in npugraph.trace.records if isinstance(k, T.Kernel) and "threshold_backward" in k.op]
    assert captured and all(k.graph is not None for k in captured)
    npugraph.assert_clean()


def test_a_custom_function_backward_runs_on_its_forwards_stream_in_the_calling_thread(npugraph):
    """A Python ``autograd.Function`` node: its ``backward`` sees its forward's stream as current
    (the engine sets it), and runs in the thread that called backward (moved from tests/test_zz_ag.py)."""
    import threading

    x, w = data()
    caller = threading.get_ident()
    seen = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append((threading.get_ident(), torch.npu.current_stream()))
            return g

    s = side()
    with torch.npu.stream(s):
        loss = (Spy.apply(x) @ w).sum()
        loss.backward()
    torch.npu.current_stream().wait_stream(s)
    z = x.grad * 2
    assert seen == [(caller, s)]
    assert torch.allclose(z.cpu(), 2 * w.detach().cpu().sum(1).expand(8, 8))
    npugraph.assert_clean()
