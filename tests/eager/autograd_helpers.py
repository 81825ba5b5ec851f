"""Shared helpers of the autograd-streams tests, eager (tests/eager/test_autograd_streams.py) and
compiled (tests/graph/test_compiled_backward.py): the same small training problem, its CPU
gradients, a side stream, and where backward kernels ran."""
import torch

from pytest_npugraph import trace as T


def data(device="npu"):
    """``x`` and ``w`` (8x8, requiring grad) on ``device``, the same numbers every call."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 8, generator=g).to(device).requires_grad_()
    w = torch.randn(8, 8, generator=g).to(device).requires_grad_()
    return x, w


def loss_of(x, w):
    return (x @ w).relu().sum()


def expected_grads(x, w):
    """``loss_of``'s gradients for ``x`` and ``w``'s values, computed on the CPU."""
    xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    loss_of(xc, wc).backward()
    return xc.grad, wc.grad


def side():
    """A new stream that has waited for the current one (so it may read what was made there)."""
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    return s


def backward_streams(npugraph, op):
    """Labels of the streams the kernels whose op contains ``op`` ran on, eagerly or replayed (not the
    shadows a capture records)."""
    trace = npugraph.trace
    return {trace.streams[k.stream].label for k in trace.records
            if isinstance(k, T.Kernel) and op in k.op and (k.graph is None or not k.graph.capture)}
