"""Graphs are named after the user's code in every compiled mode (issue 27, item 3): the function
``torch.compile`` was given (a module: ``Class.forward``), or the line that began a
``torch.npu.NPUGraph`` capture; the same name in the text report, the timeline and the HTML report.
TorchAir's own names (``graph_1``) stay in ``npugraph.graphs[i].name`` and its counters."""
import html
import inspect
import json
import re

import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from torchair import scope
from torchair.configs.compiler_config import CompilerConfig

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import analyze
from pytest_npugraph.report.html import render
from pytest_npugraph.report.timeline import chrome_trace

HERE = "tests/report/test_graph_names.py"


def _line(fn, text) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _backend(mode):
    if mode == "npugraph_ex":
        return "npugraph_ex"
    config = CompilerConfig()
    config.mode = mode
    return torchair.get_npu_backend(compiler_config=config)


def _compile(fn, mode, dynamic=False):
    return torch.compile(fn, backend=_backend(mode), dynamic=dynamic, fullgraph=True)


def _stream_labels(npugraph) -> set:
    return {info.label for info in npugraph.trace.streams.values()}


def decode_step(a, b):
    with scope.npu_stream_switch("7"):
        c = torch.mm(a, b)
    with scope.npu_stream_switch("8"):
        d = c + 1                      # no tagged event orders it after the mm
    return d


class Attention(torch.nn.Module):
    def forward(self, a, b):
        return decode_step(a, b)


def _ones():
    return torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu")


# --------------------------------------------------------------------- reduce-overhead
def test_reduce_overhead_race_names_the_compiled_function_and_its_tags(npugraph):
    with npugraph.expect("race", match=r"npu:0/decode_step:tag '8' \(stream-\d+\) \w+ it .* "
                                       r"npu:0/decode_step:tag '7' \(stream-\d+\) may still be writing it"):
        _compile(decode_step, "reduce-overhead")(*_ones())
    labels = _stream_labels(npugraph)
    assert not any("graph_" in label for label in labels)
    # the stream its captures allocate on is the graph's too, not an anonymous pool stream
    assert sum(re.fullmatch(r"npu:0/decode_step:capture \(stream-\d+\)", label) is not None for label in labels) == 1
    (record,) = npugraph.graphs
    assert (record.name, record.label) == ("graph_1", "decode_step")     # TorchAir's name stays in the record
    replayed = {str(r.graph) for r in npugraph.trace.records if type(r) is T.Kernel and r.graph is not None}
    assert replayed == {"decode_step#capture", "decode_step#replay1"}   # no key: TorchAir's hash key is not shown


def test_a_compiled_module_is_named_by_its_class_and_forward(npugraph):
    with npugraph.expect("race", match=r"npu:0/Attention\.forward:tag '8'"):
        _compile(Attention(), "reduce-overhead")(*_ones())
    assert npugraph.graphs[0].label == "Attention.forward"


def test_a_second_graph_of_the_same_function_is_numbered(npugraph):
    step = _compile(decode_step, "reduce-overhead")
    with npugraph.expect("race", match=r"decode_step:tag '8'"):
        step(*_ones())
    with npugraph.expect("race", match=r"decode_step#2:tag '8'"):     # another shape: Dynamo recompiles
        step(torch.ones(2, 2, device="npu"), torch.ones(2, 2, device="npu"))
    assert [g.label for g in npugraph.graphs] == ["decode_step", "decode_step#2"]
    assert [g.name for g in npugraph.graphs] == ["graph_1", "graph_2"]


def test_the_graphs_around_a_graph_break_keep_the_functions_name(npugraph):
    def mlp(x):
        h = x * 2
        torch._dynamo.graph_break()
        return h + 1

    out = torch.compile(mlp, backend=_backend("reduce-overhead"), dynamic=False)(torch.ones(4, device="npu"))
    assert out.cpu().tolist() == [3.0] * 4
    assert [g.label for g in npugraph.graphs] == ["mlp", "mlp#2"]   # not torch_dynamo_resume_in_mlp_at_N


def test_a_lambda_is_named_by_its_line(npugraph):
    square = _compile(lambda x: x * x, "reduce-overhead")
    square(torch.ones(4, device="npu"))
    assert npugraph.graphs[0].label == f"lambda@{HERE}:{_line(test_a_lambda_is_named_by_its_line, 'lambda x')}"


def test_output_overwrite_names_the_function_and_a_key_picked_by_a_shape(npugraph):
    def grow(x):
        return x + 1

    step = _compile(grow, "reduce-overhead", dynamic=True)
    small = step(torch.ones(4, device="npu"))
    step(torch.ones(6, device="npu"))
    with npugraph.expect("output-overwrite", match=r"the output of grow\[\[4\]\] returned by .* "
                                                   r"\(replay 2 of grow\[\[6\]\]\) overwrote it"):
        small.sum().item()


# ------------------------------------------------------------------------------ npugraph_ex
def test_npugraph_ex_output_overwrite_names_the_compiled_function(npugraph):
    def logits_of(x):
        return x * 2

    step = _compile(logits_of, "npugraph_ex")
    kept = step(torch.ones(4, device="npu"))
    step(torch.zeros(4, device="npu"))
    with npugraph.expect("output-overwrite", match=r"the output of logits_of returned by the call at .* "
                                                   r"\(replay 2 of logits_of\) overwrote it"):
        kept.cpu()
    assert npugraph.graphs[0].label == "logits_of" and npugraph.graphs[0].name == "graph_1"


# ------------------------------------------------------------------------------------- GE
def test_ge_streams_are_named_after_the_compiled_function(npugraph):
    def prefill(x, y):
        a = x + 1
        with scope.npu_stream_switch("s"):
            b = a * y
        return a + b

    _compile(prefill, "max-autotune")(torch.ones(4, device="npu"), torch.ones(4, device="npu"))
    labels = _stream_labels(npugraph)
    assert {"npu:0/prefill:main", "npu:0/prefill:tag 's'"} <= labels
    assert not any("graph_" in label for label in labels)
    edges = {info.label for info in npugraph.trace.events.values() if " edge" in info.label}
    assert edges and all(label.startswith("prefill edge") for label in edges)


def test_ge_super_kernel_report_names_the_graph_by_the_function(npugraph, op_profiles):
    op_profiles["mul"] = {"kind": "AIV", "set_next_task_start": True}

    def decode_layer(x):
        with scope.super_kernel("decode"):
            a = x * 2                  # calls SetNextTaskStart
            return a + 1               # the next sub-kernel reads a

    with npugraph.expect("super-kernel", match=r"in SuperKernel scope 'decode' .* on npu:0/decode_layer:main"):
        _compile(decode_layer, "max-autotune")(torch.ones(4, device="npu"))


# --------------------------------------------------------------------------- NPUGraph capture
def test_a_capture_is_named_by_its_with_line(npugraph):
    g = torch.npu.NPUGraph()
    x = torch.ones(4, device="npu")
    with torch.npu.graph(g):
        y = x * 2
    begin = _line(test_a_capture_is_named_by_its_with_line, "with torch.npu.graph(g)")
    (capture,) = [m for m in npugraph.trace.records if type(m) is T.CaptureBegin]
    assert capture.graph.label == f"NPUGraph@{HERE}:{begin}"
    kept = y.clone()
    g.replay()
    assert kept.cpu().tolist() == [2.0] * 4


def test_output_overwrite_in_an_eager_capture_names_the_capture_line(npugraph):
    model = torch.nn.Linear(4, 4).npu().requires_grad_(False)
    graphed = torch_npu.npu.make_graphed_callables(model, (torch.ones(2, 4, device="npu"),))
    made = _line(test_output_overwrite_in_an_eager_capture_names_the_capture_line, "make_graphed_callables")
    kept = graphed(torch.ones(2, 4, device="npu"))
    graphed(torch.zeros(2, 4, device="npu"))
    with npugraph.expect("output-overwrite", match=rf"NPUGraph@{HERE}:{made}\b"):
        torch.cat([kept, kept]).cpu()


def test_two_captures_on_one_line_are_numbered(npugraph):
    x = torch.ones(4, device="npu")
    graphs = []
    for _ in range(2):
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            x * 2
        graphs.append(g)
    begin = _line(test_two_captures_on_one_line_are_numbered, "with torch.npu.graph(g)")
    names = [m.graph.label for m in npugraph.trace.records if type(m) is T.CaptureBegin]
    assert names == [f"NPUGraph@{HERE}:{begin}", f"NPUGraph@{HERE}:{begin}#2"]


# ---------------------------------------------------------------- one name in text, timeline, HTML
def test_text_timeline_and_html_use_the_same_graph_names(npugraph):
    with npugraph.expect("race"):
        _compile(decode_step, "reduce-overhead")(*_ones())
    (race,) = analyze(npugraph.trace, kinds=["race"])
    tag7 = next(label for label in _stream_labels(npugraph) if label.startswith("npu:0/decode_step:tag '7'"))
    assert tag7 in race.message and tag7 in race.streams
    data = chrome_trace(npugraph.trace, [race], {race.key: "expected"})
    tracks = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tag7 in tracks
    graphs = {e["args"]["graph"] for e in data["traceEvents"] if e["ph"] == "X" and e["args"].get("graph")}
    assert graphs == {"decode_step#capture", "decode_step#replay1"}
    page = render([{"nodeid": "test_x", "outcome": "passed", "duration": 0.0, "timeline": json.dumps(data)}], "")
    assert html.escape(race.message) in page                     # the hazard list: the text report's message
    assert json.dumps(tag7) in page and '"graph":"decode_step#replay1"' in page   # the drawn timeline's data
    assert "graph_1" not in page


def _capture_twice(rank):
    x = torch.ones(4, device="npu")
    for _ in range(2):
        with torch.npu.graph(torch.npu.NPUGraph()):
            x * 2
    return rank


@pytest.mark.npu_devices(2)
def test_captures_under_run_ranks_are_numbered_per_rank(npugraph):
    """Each rank captures its own graphs: their names say the rank and do not follow thread timing."""
    assert npugraph.run_ranks(_capture_twice) == [0, 1]
    begin = _line(_capture_twice, "with torch.npu.graph(")
    names = sorted(m.graph.label for m in npugraph.trace.records if type(m) is T.CaptureBegin)
    assert names == sorted(f"NPUGraph@{HERE}:{begin}{n} of rank {r}" for r in (0, 1) for n in ("", "#2"))
