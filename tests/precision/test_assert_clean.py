"""``npugraph.assert_clean()`` fails on what fails the test and lists warnings (docs/reference.md, "The npugraph fixture")."""
import pytest
import torch
import torch_npu  # noqa: F401
import torchair as tng
from torchair.configs.compiler_config import CompilerConfig

N = 8


class Decode(torch.nn.Module):
    """KV read on stream '1' behind tagged events, then updated out of place on main: correct code,
    but the reinplace pass is vetoed (a warning: the graph pays a copy)."""

    def __init__(self):
        super().__init__()
        self.kv_ready = tng.ops.npu_create_tagged_event(tag="clean_kv_ready")
        self.scores_done = tng.ops.npu_create_tagged_event(tag="clean_scores_done")

    def forward(self, h, wkv, q, bias):
        kv = h @ wkv
        tng.ops.npu_tagged_event_record(self.kv_ready)
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.kv_ready)
            scores = q @ kv.T
            tng.ops.npu_tagged_event_record(self.scores_done)
        tng.ops.npu_tagged_event_wait(self.scores_done)
        return scores, kv.add(bias)


def run_decode():
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    model = torch.compile(Decode(), backend=tng.get_npu_backend(compiler_config=config), dynamic=False,
                          fullgraph=True)
    args = [torch.randn(N, N).npu() for _ in range(4)]
    for _ in range(2):
        model(*args)


def test_a_warning_alone_does_not_fail_assert_clean(npugraph):
    run_decode()
    assert [h.severity for h in npugraph.hazards] == ["warning"]
    npugraph.assert_clean()


def test_naming_the_kind_includes_its_warnings(npugraph):
    run_decode()
    with pytest.raises(AssertionError, match=r"reinplace-conflict.*\n.*pay a copy"):
        npugraph.assert_clean("reinplace-conflict")
    npugraph.assert_clean("race")


def test_an_error_fails_it_and_the_report_lists_the_warnings_too(npugraph):
    run_decode()
    x = torch.ones(8, device="npu")
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        x.add_(1)                        # no side.wait_stream(main): races with the fill
    with pytest.raises(AssertionError) as raised:
        npugraph.assert_clean()
    text = str(raised.value)
    assert "pay a copy" in text and "--- 1. race ---" in text and "aten::add_.Tensor at" in text
    npugraph._hazards.absorbed.update(h.key for h in npugraph.hazards if h.kind == "race")


@pytest.mark.npu_allow("race")
def test_an_allowed_kind_does_not_fail_it(npugraph):
    x = torch.ones(8, device="npu")
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        x.add_(1)
    assert [h.kind for h in npugraph.hazards] == ["race"]
    npugraph.assert_clean()
    with pytest.raises(AssertionError, match="race"):
        npugraph.assert_clean("race")
