"""Seed 001: multi-stream reduce-overhead (aclgraph) graphs ordered with tagged events.

In reduce-overhead mode TorchAir forks each side stream from the capture stream at graph start and
joins it before the output; every other dependency between streams needs a tagged event
(``npu_tagged_event_record`` / ``npu_tagged_event_wait``).  Here stream '2' consumes the matmul
that stream '1' produces: without the wait on tag "77" the replayed graph races.  The model is the
seed's, with the add on stream '2' consuming ``mm_result`` and the sizes made small.
"""
import torch
import torch_npu
import torchair as tng
from torchair.configs.compiler_config import CompilerConfig

N = 64


class Model(torch.nn.Module):
    def __init__(self, wait_for_mm=True):
        super().__init__()
        self.wait_for_mm = wait_for_mm
        self.tagged_event1 = tng.ops.npu_create_tagged_event(tag="66")
        self.tagged_event2 = tng.ops.npu_create_tagged_event(tag="77")

    def forward(self, in1, in2, in3, in4):
        add_result = torch.add(in1, in2)
        tng.ops.npu_tagged_event_record(self.tagged_event1)
        with tng.scope.npu_stream_switch('1'):
            tng.ops.npu_tagged_event_wait(self.tagged_event1)     # mm waits for add_result
            mm_result = torch.mm(in3, add_result)
            tng.ops.npu_tagged_event_record(self.tagged_event2)
        mm1 = torch.mm(in3, in4)
        with tng.scope.npu_stream_switch('2'):
            if self.wait_for_mm:
                tng.ops.npu_tagged_event_wait(self.tagged_event2)  # add2 waits for mm_result
            add2 = torch.add(mm_result, in4)
        return add_result, mm_result, mm1, add2


def compiled(model):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    return torch.compile(model, backend=tng.get_npu_backend(compiler_config=config), dynamic=False, fullgraph=True)


def inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(N, N, generator=g).npu() for _ in range(4)]


def test_consumer_stream_without_the_tagged_wait_races(npugraph):
    model = compiled(Model(wait_for_mm=False))
    # streams are named by their npu_stream_switch tags (the pool stream in parentheses)
    with npugraph.expect("race", match=r"npu:0/Model\.forward:tag '2' \(stream-\d+\) reads it in aten::add.Tensor .* "
                                       r"npu:0/Model\.forward:tag '1' \(stream-\d+\) may still be writing it in aten::mm"):
        model(*inputs())


def test_seed_tagged_events_order_the_streams(npugraph):
    model = compiled(Model())
    in1, in2, in3, in4 = inputs()
    for _ in range(3):                                        # capture once, replay every call
        add_result, mm_result, mm1, add2 = model(in1, in2, in3, in4)
    a, b, c, d = (t.cpu() for t in (in1, in2, in3, in4))
    torch.testing.assert_close(mm_result.cpu(), c @ (a + b))
    torch.testing.assert_close(add2.cpu(), c @ (a + b) + d)
    torch.testing.assert_close(mm1.cpu(), c @ d)
    (record,) = npugraph.graphs
    assert (record.mode, record.captures, record.replays) == ("reduce-overhead", 1, 3)
    assert record.stream_of("aten.mm") == "1" and record.stream_of("aten.add.Tensor") is None
    npugraph.assert_clean()
