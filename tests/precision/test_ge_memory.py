"""GE plans a graph's memory itself: no ``missing-record-stream`` inside a GE graph; reduce-overhead keeps it."""
import pytest
import torch
import torch_npu  # noqa: F401
import torchair as tng
from torchair.configs.compiler_config import CompilerConfig


class MoE(torch.nn.Module):
    """The shared expert in an ``npu_stream_switch`` scope, no events (GE synchronises data edges)."""

    def forward(self, x, w_shared, w_up, w_down):
        h = torch.nn.functional.silu(x * 2)                  # main stream, freed inside the graph
        with tng.scope.npu_stream_switch("1"):
            shared = torch.relu(h @ w_shared)                # read on stream '1'
        routed = torch.relu(h @ w_up) @ w_down
        return routed + shared


def compiled(mode):
    config = CompilerConfig()
    config.mode = mode
    return torch.compile(MoE(), backend=tng.get_npu_backend(compiler_config=config), dynamic=False, fullgraph=True)


def args():
    return [torch.randn(16, 16).npu() for _ in range(4)]


def test_ge_graph_has_no_missing_record_stream(npugraph):
    model, a = compiled("max-autotune"), args()
    for _ in range(3):
        out = model(*a)
    x, ws, wu, wd = (t.cpu() for t in a)
    h = torch.nn.functional.silu(x * 2)
    torch.testing.assert_close(out.cpu(), torch.relu(h @ wu) @ wd + torch.relu(h @ ws))
    npugraph.assert_clean()


@pytest.mark.npu_allow("race", "missing-record-stream", "reinplace-conflict")
def test_the_same_graph_in_reduce_overhead_is_still_reported(npugraph):
    model, a = compiled("reduce-overhead"), args()
    for _ in range(3):
        model(*a)
    # the replay really reuses h's memory while stream '1' may still read it: reported
    assert any(h.kind == "race" and "memory that changed owner" in h.message for h in npugraph.hazards)
