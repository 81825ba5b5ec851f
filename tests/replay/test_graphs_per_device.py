"""Graphs are per device (issue 24, item 2): a graph compiled or captured on npu:N captures, replays,
copies its inputs, clones its outputs and keeps its pool and streams on npu:N, in every mode
(reduce-overhead, npugraph_ex, TorchAir's GE max-autotune, ``torch.npu.NPUGraph``/``torch.npu.graph``);
values are right on every call and correct code gets no hazard."""
import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from torchair import scope

from pytest_npugraph import trace as T

from graph.helpers import backend, config

MODES = ["reduce-overhead", "npugraph_ex", "ge"]


def compiled(fn, mode, **debug):
    if debug:
        return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config(mode, **debug)),
                             fullgraph=True, dynamic=False)
    return torch.compile(fn, backend=backend(mode), fullgraph=True, dynamic=False)


def devices_of(npugraph, kind=T.Kernel, since=0) -> set:
    """The devices of the streams that ran the trace's records of ``kind`` (from record ``since`` on)."""
    trace = npugraph.trace
    return {trace.streams[r.stream].device for r in trace.records[since:]
            if isinstance(r, kind) and getattr(r, "stream", None) is not None}


def graph_kernels(npugraph, since=0) -> list:
    """Kernels of a compiled or captured graph: aclgraph tasks carry their graph; GE's run on the
    graph's own streams (labelled with the graph's name)."""
    trace = npugraph.trace
    return [r for r in trace.records[since:] if isinstance(r, T.Kernel)
            and (r.graph is not None or ":main" in trace.streams[r.stream].label
                 or ":tag" in trace.streams[r.stream].label)]


def graph_of(npugraph, kernel) -> str:
    """The graph's name: of the replay, else of the GE stream ``npu:0/<graph>:main`` (a graph's name
    can hold a colon: ``lambda@test_x.py:12``)."""
    if kernel.graph is not None:
        return kernel.graph.name
    return npugraph.trace.streams[kernel.stream].label.split("/", 1)[1].rsplit(":", 1)[0]


# --------------------------------------------------------------------------- compiled modes
@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("mode", MODES)
def test_every_call_on_npu1_gives_its_own_values_and_runs_on_npu1(npugraph, mode):
    f = compiled(lambda x: x * 3, mode)
    for i in range(3):
        out = f(torch.full((4,), i + 1.0, device="npu:1"))
        assert out.device == torch.device("npu:1")
        assert out.cpu().tolist() == [3.0 * (i + 1)] * 4
    assert devices_of(npugraph) == {1}                 # copies, capture, replays, reads: all npu:1
    assert graph_kernels(npugraph), "the graph's kernels are in the trace"
    assert {npugraph.trace.streams[k.stream].device for k in graph_kernels(npugraph)} == {1}
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_captured_graph_and_its_pool_live_on_npu1(npugraph, mode):
    f = compiled(lambda x, y: (x + y) * 2, mode)
    y = torch.ones(4, device="npu:1")
    for i in range(3):
        assert f(torch.full((4,), float(i), device="npu:1"), y).cpu().tolist() == [2.0 * (i + 1)] * 4
    captures = [r for r in npugraph.trace.records if isinstance(r, T.CaptureBegin)]
    assert captures and {npugraph.trace.streams[c.stream].device for c in captures} == {1}
    assert torch.npu.memory_allocated(0) == 0          # nothing of the graph (pool, input buffers) on npu:0
    assert torch.npu.memory_allocated(1) > 0
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_output_clone_and_input_clone_options_on_npu1(npugraph):
    f = compiled(lambda x: x.sin() + 1, "reduce-overhead", enable_output_clone=True)
    outs = [f(torch.full((4,), float(i), device="npu:1")) for i in range(3)]
    for i, out in enumerate(outs):                     # clones: earlier outputs keep their values
        assert out.device == torch.device("npu:1")
        assert torch.allclose(out.cpu(), torch.full((4,), float(i)).sin() + 1)
    assert devices_of(npugraph) == {1}
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("mode", ["reduce-overhead", "ge"])
def test_stream_scopes_of_a_graph_on_npu1_get_npu1_streams(npugraph, mode):
    def f(x):
        with scope.npu_stream_switch("1"):
            a = x + 1
        b = x * 2
        return a, b

    g = compiled(f, mode)
    for i in range(3):
        a, b = g(torch.full((4,), float(i), device="npu:1"))
        assert (a.cpu().tolist(), b.cpu().tolist()) == ([i + 1.0] * 4, [2.0 * i] * 4)
    labels = {npugraph.trace.streams[k.stream].label for k in graph_kernels(npugraph)}
    assert len(labels) >= 2 and all(label.startswith("npu:1/") for label in labels), labels
    assert devices_of(npugraph, T.EventRecord) == devices_of(npugraph, T.EventWait) == {1}
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_native_side_stream_on_npu1_in_npugraph_ex(npugraph):
    side = torch.npu.Stream(device="npu:1")

    def f(x):
        h = x * 2
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            s = h + 1
        torch.npu.current_stream().wait_stream(side)
        return h + s

    g = compiled(f, "npugraph_ex")
    with torch.npu.device(1):
        for i in range(3):
            assert g(torch.full((4,), float(i), device="npu:1")).cpu().tolist() == [4.0 * i + 1] * 4
    assert devices_of(npugraph) == {1}
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("mode", MODES)
def test_npu0_and_npu1_graphs_used_alternately(npugraph, mode):
    f = compiled(lambda x: x * 3 + 1, mode)
    outs = []
    for i in range(6):
        out = f(torch.full((4,), float(i), device=f"npu:{i % 2}"))
        assert out.device == torch.device(f"npu:{i % 2}")
        outs.append(out.cpu().tolist())
    assert outs == [[3.0 * i + 1] * 4 for i in range(6)]
    by_graph: dict = {}                                # each graph's work on its own device
    for k in graph_kernels(npugraph):
        by_graph.setdefault(graph_of(npugraph, k), set()).add(npugraph.trace.streams[k.stream].device)
    assert sorted(map(sorted, by_graph.values())) == [[0], [1]]
    npugraph.assert_clean()


# --------------------------------------------------------------------- NPUGraph / graph
@pytest.mark.npu_devices(2)
def test_npugraph_captured_on_npu1_replays_on_npu1_from_any_current_device(npugraph):
    x = torch.zeros(4, device="npu:1")
    g = torch.npu.NPUGraph()
    with torch.npu.device(1):
        with torch.npu.graph(g):
            y = x * 3
    assert torch.npu.current_device() == 0
    for i in range(3):
        x.fill_(i + 1)
        g.replay()                                     # on npu:1's current stream, as NPUGraph::replay
        assert y.cpu().tolist() == [3.0 * (i + 1)] * 4
    replays = [k for k in graph_kernels(npugraph) if k.graph.replay]
    assert len(replays) == 3 and {npugraph.trace.streams[k.stream].label for k in replays} == {"npu:1/default"}
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_npugraph_on_npu1_with_its_own_stream_and_pool(npugraph):
    with torch.npu.device(1):
        s = torch.npu.Stream()
        pool = torch.npu.graph_pool_handle()
        x = torch.zeros(4, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, pool=pool, stream=s):
            y = (x + 1) * 2
    assert x.device == y.device == torch.device("npu:1")
    for i in range(3):
        x.fill_(i)
        g.replay()
        assert y.cpu().tolist() == [2.0 * (i + 1)] * 4
    assert devices_of(npugraph) == {1}
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_npugraphs_of_npu0_and_npu1_replayed_alternately(npugraph):
    graphs = []
    for d in (0, 1):
        with torch.npu.device(d):
            x = torch.zeros(4, device="npu")
            g = torch.npu.NPUGraph()
            with torch.npu.graph(g, stream=torch.npu.Stream()):
                y = x * (d + 2)
            graphs.append((x, g, y))
    for i in range(6):
        x, g, y = graphs[i % 2]
        x.fill_(i)
        g.replay()
        assert y.cpu().tolist() == [float(i * (i % 2 + 2))] * 4
    for d, (_, g, _) in enumerate(graphs):
        replays = [k for k in graph_kernels(npugraph) if k.graph.name == g._graph.graph.name and k.graph.replay]
        assert {npugraph.trace.streams[k.stream].device for k in replays} == {d}
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_make_graphed_callables_on_npu1(npugraph):
    with torch.npu.device(1):
        model = torch.nn.Linear(4, 4).npu()
        sample = torch.randn(2, 4, device="npu")
        graphed = torch.npu.make_graphed_callables(model, (sample,))
    for _ in range(3):
        x = torch.randn(2, 4, device="npu:1")
        with torch.no_grad():
            expected = model(x)
        out = graphed(x)
        assert out.device == torch.device("npu:1")
        assert torch.allclose(out.cpu(), expected.cpu(), atol=1e-6)
    assert {npugraph.trace.streams[k.stream].device for k in graph_kernels(npugraph)} == {1}
    npugraph.assert_clean()
