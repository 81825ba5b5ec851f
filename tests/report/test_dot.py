"""DOT pictures of compiled graphs: streams as clusters, data / control / event edges, from the
graph record (``npugraph.graphs[i]``) and from the trace of one replay."""
import shutil
import subprocess

import pytest
import torch

from pytest_npugraph.report import graph_of, replay_graph, to_dot
from pytest_npugraph.graph_record import GraphOp, GraphRecord

N = 8


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tagged_model():
    import torchair as tng

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e1 = tng.ops.npu_create_tagged_event(tag="66")
            self.e2 = tng.ops.npu_create_tagged_event(tag="77")

        def forward(self, a, b, c):
            s = torch.add(a, b)
            tng.ops.npu_tagged_event_record(self.e1)
            with tng.scope.npu_stream_switch('1'):
                tng.ops.npu_tagged_event_wait(self.e1)
                m = torch.mm(c, s)
                tng.ops.npu_tagged_event_record(self.e2)
            with tng.scope.npu_stream_switch('2'):
                tng.ops.npu_tagged_event_wait(self.e2)
                out = torch.add(m, c)
            return s, out
    return Model()


def compiled(model, mode):
    import torchair

    config = torchair.CompilerConfig()
    config.mode = mode
    return torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config), dynamic=False,
                         fullgraph=True)


def edges(g, kind):
    return {(g.nodes[a]["label"].split("\n")[0], g.nodes[b]["label"].split("\n")[0])
            for a, b, k in g.edges(data="kind") if k == kind}


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_reduce_overhead_graph_streams_events_and_cross_stream_data(npugraph):
    model = compiled(tagged_model(), "reduce-overhead")
    a, b, c = (torch.randn(N, N).npu() for _ in range(3))
    model(a, b, c)
    g = graph_of(npugraph.graphs[0])
    streams = {name: attrs["stream"] for name, attrs in g.nodes(data=True)}
    assert (streams["add"], streams["mm"], streams["add_1"]) == ("main", "1", "2")
    assert not any("scope" in n for n in g.nodes)
    assert {("record 66", "wait 66"), ("record 77", "wait 77")} <= edges(g, "event")
    (fork,) = [n for n, label in g.nodes(data="label") if label.startswith("record graph_1_arg0")]
    assert sorted(g.nodes[w]["stream"] for w in g.successors(fork) if g.edges[fork, w]["kind"] == "event") == \
        ["1", "2"]                                           # TorchAir's fork: one wait per side stream
    assert edges(g, "cross") == {("add", "mm"), ("mm", "add_1")}
    assert ("wait 66", "mm") in edges(g, "stream")           # the wait comes before mm on stream '1'
    dot = to_dot(npugraph.graphs[0])
    assert 'label="stream \'1\'"' in dot and 'label="main stream"' in dot
    assert dot.count("style=dashed") == sum(k == "event" for _, _, k in g.edges(data="kind")) == 6


def test_ge_graph_wait_tensor_is_a_control_edge(npugraph):
    import torchair as tng

    class Model(torch.nn.Module):
        def forward(self, a, b):
            s = torch.add(a, b)
            with tng.scope.npu_stream_switch('1'):
                tng.scope.npu_wait_tensor(b, s)
                m = torch.mm(b, b)
            return s, m

    compiled(Model(), "max-autotune")(torch.randn(N, N).npu(), torch.randn(N, N).npu())
    g = graph_of(npugraph.graphs[0])
    assert edges(g, "control") == {("add", "wait_tensor")}
    assert g.nodes["wait_tensor"]["stream"] == "1" and g.nodes["wait_tensor"]["kind"] == "wait_tensor"


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_replay_graph_from_the_trace_orders_streams_by_events(npugraph):
    model = compiled(tagged_model(), "reduce-overhead")
    a, b, c = (torch.randn(N, N).npu() for _ in range(3))
    model(a, b, c)
    model(a, b, c)
    g = replay_graph(npugraph.trace, "#replay2")
    ops = {attrs["label"].split("\n")[0]: attrs["stream"] for _, attrs in g.nodes(data=True) if attrs["kind"] == "op"}
    assert ops.keys() == {"add.Tensor", "add_.Tensor", "mm"} and len(set(ops.values())) == 3
    assert ("mm", "add_.Tensor") in edges(g, "cross")        # stream '2' updates (reinplaced) what stream '1' wrote
    assert edges(g, "event")                                 # record -> wait pairs of the replay
    with pytest.raises(KeyError, match="no kernel"):
        replay_graph(npugraph.trace, "#replay9")


def test_a_record_without_an_fx_graph_still_shows_its_streams():
    record = GraphRecord("graph_7", "max-autotune", [GraphOp("mm", "aten.mm.default", "1"),
                                                     GraphOp("scope_enter", "air.scope_enter.default", "1"),
                                                     GraphOp("add", "aten.add.Tensor", None)])
    g = graph_of(record)
    assert dict(g.nodes(data="stream")) == {"mm": "1", "add": "main"} and not g.edges
    assert to_dot(record).startswith('digraph "graph_7" {')


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_graphviz_accepts_the_dot(tmp_path):
    record = GraphRecord('graph "q"', "reduce-overhead", [GraphOp("a\\b", "aten.mm.default", "x y")])
    result = subprocess.run(["dot", "-Tsvg"], input=to_dot(record), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "<svg" in result.stdout
