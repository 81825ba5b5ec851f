"""``zeros_like``/``ones_like``/``full_like``/``new_zeros`` & co fill their result: a device task that
writes it (and, inside a captured graph, a replay step), while they read only their input's metadata.

Why: they were treated as allocations, so a replayed graph never re-zeroed its accumulator and a MoE
loop ``routed = zeros_like(x); routed = routed + expert(x) * w`` compiled with reduce-overhead or
npugraph_ex returned twice the right values after TorchAir's reinplace pass made the adds in place;
and a race on the filled memory went unseen in eager mode."""
import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.trace import Kernel

from .helpers import backend


def _moe(x, ws, gates):
    routed = torch.zeros_like(x)
    for i, w in enumerate(ws):
        routed = routed + (x @ w) * gates[:, i:i + 1]
    return routed


def _ones_then_scale(x):
    acc = x.new_ones(x.shape)
    acc += x
    return torch.full_like(x, 2.0) * acc


@pytest.mark.parametrize("fn", [_moe, _ones_then_scale], ids=["moe-loop", "ones-full"])
@pytest.mark.parametrize("mode", ["ge", "reduce-overhead", "npugraph_ex"])
def test_a_compiled_accumulator_starts_from_its_fill_on_every_call(npugraph, mode, fn):
    torch.manual_seed(0)
    x, gates = torch.randn(8, 16), torch.rand(8, 3)
    ws = [torch.randn(16, 16) for _ in range(3)]
    args = (x, ws, gates) if fn is _moe else (x,)
    want = fn(*args)
    npu_args = (x.npu(), [w.npu() for w in ws], gates.npu()) if fn is _moe else (x.npu(),)
    compiled = torch.compile(fn, backend=backend(mode), dynamic=False)
    for _ in range(3):                                   # capture, then replays
        torch.testing.assert_close(compiled(*npu_args).cpu(), want, rtol=1e-4, atol=1e-4)
    npugraph.assert_clean()


@pytest.mark.parametrize("make", ["zeros_like", "ones_like", "full_like", "new_zeros", "rand_like"])
def test_a_fill_factory_is_a_task_that_writes_its_result_and_reads_nothing(npugraph, make):
    x = torch.ones(4, device="npu")
    before = len(npugraph.trace.records)
    out = {"zeros_like": lambda: torch.zeros_like(x), "ones_like": lambda: torch.ones_like(x),
           "full_like": lambda: torch.full_like(x, 3.0), "new_zeros": lambda: x.new_zeros(4),
           "rand_like": lambda: torch.rand_like(x)}[make]()
    kernel, = [r for r in npugraph.trace.records[before:] if type(r) is Kernel]
    assert kernel.reads == () and len(kernel.writes) == 1
    assert out.shape == (4,)


def test_empty_like_stays_an_allocation(npugraph):
    x = torch.ones(4, device="npu")
    before = len(npugraph.trace.records)
    torch.empty_like(x)
    x.new_empty(3)
    assert not [r for r in npugraph.trace.records[before:] if type(r) is Kernel]


def test_a_fill_on_a_side_stream_read_without_a_wait_is_a_race(npugraph):
    x = torch.ones(4, device="npu")
    side = torch.npu.Stream()
    with npugraph.expect("race", match="zeros_like"):
        with torch.npu.stream(side):
            acc = torch.zeros_like(x)
        (acc + 1).sum()                                  # the default stream may run before the fill


def test_a_fill_on_a_side_stream_read_after_a_wait_stays_silent(npugraph):
    x = torch.ones(4, device="npu")
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        acc = torch.zeros_like(x)
    torch.npu.current_stream().wait_stream(side)
    assert (acc + 1).sum().item() == 4.0
    npugraph.assert_clean()
