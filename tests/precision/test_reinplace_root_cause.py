"""A race the functional graph already has is a ``race``, not a ``reinplace-conflict`` (one report)."""
import re

import pytest
import torch
import torch_npu  # noqa: F401
import torchair as tng
from torchair.configs.compiler_config import CompilerConfig


class Branches(torch.nn.Module):
    """GE-style code ported to reduce-overhead without events: both branches read ``h`` and main reads
    both results, nothing ordered.  ``sigmoid`` on stream '2' is reinplaced into ``sigmoid_``."""

    def __init__(self, events=False):
        super().__init__()
        self.events = events
        if events:
            self.h_ready = tng.ops.npu_create_tagged_event(tag="rc_h_ready")
            self.a_done = tng.ops.npu_create_tagged_event(tag="rc_a_done")
            self.b_done = tng.ops.npu_create_tagged_event(tag="rc_b_done")

    def forward(self, x, w1, w2):
        h = x @ w1
        if self.events:
            tng.ops.npu_tagged_event_record(self.h_ready)
        with tng.scope.npu_stream_switch("1"):
            if self.events:
                tng.ops.npu_tagged_event_wait(self.h_ready)
            a = torch.relu(h @ w2)
            if self.events:
                tng.ops.npu_tagged_event_record(self.a_done)
        with tng.scope.npu_stream_switch("2"):
            if self.events:
                tng.ops.npu_tagged_event_wait(self.h_ready)
            b = torch.sigmoid(h * 2)
            if self.events:
                tng.ops.npu_tagged_event_record(self.b_done)
        if self.events:
            tng.ops.npu_tagged_event_wait(self.a_done)
            tng.ops.npu_tagged_event_wait(self.b_done)
        return a.add(b)


def run(model):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    compiled = torch.compile(model, backend=tng.get_npu_backend(compiler_config=config), dynamic=False,
                             fullgraph=True)
    args = [torch.randn(8, 8).npu() for _ in range(3)]
    for _ in range(2):
        out = compiled(*args)
    x, w1, w2 = (t.cpu() for t in args)
    h = x @ w1
    torch.testing.assert_close(out.cpu(), torch.relu(h @ w2) + torch.sigmoid(h * 2))


@pytest.mark.npu_allow("race")
def test_unordered_consumer_of_a_reinplaced_producer_is_a_race_only(npugraph):
    run(Branches())
    races = [h.message for h in npugraph.hazards if h.kind == "race"]
    assert any(re.search(r"reads it in aten::add_\.Tensor .* writing it in aten::sigmoid_", m) for m in races)
    errors = [h for h in npugraph.hazards if h.kind == "reinplace-conflict" and h.severity == "error"]
    assert errors == []


def test_with_tagged_events_the_same_graph_is_clean(npugraph):
    run(Branches(events=True))
    npugraph.assert_clean()
