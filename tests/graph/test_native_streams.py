"""Native ``torch.npu.Stream``/``Event`` code inside compiled regions (issue 12): torch_npu's Dynamo
patch, TorchAir's ``replace_stream_event_pass`` and npugraph_ex's per-stream event closure
(reference torchair_api.md §2.6-2.7), in the npugraph_ex backend and in torchair's reduce-overhead and
``mode="npugraph_ex"``; every check runs on what the captured graph does."""
import pytest
import torch
import torch_npu  # noqa: F401
import torchair

from pytest_npugraph.analysis import analyze
from pytest_npugraph.analysis.happens_before import HappensBefore

from .helpers import config, kernels, nodes, stream_label

MODES = ["npugraph_ex", "reduce-overhead", "torchair-npugraph_ex"]


def compile_in(mode, fn, **options):
    kwargs = {"options": options} if options else {}
    if mode == "npugraph_ex":
        return torch.compile(fn, backend="npugraph_ex", fullgraph=True, dynamic=False, **kwargs)
    cfg = config("npugraph_ex" if mode == "torchair-npugraph_ex" else "reduce-overhead")
    return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=cfg), fullgraph=True, dynamic=False,
                         **kwargs)


def shared_expert(side, wait_before: bool, wait_after: bool):
    def block(x, w_routed, w_shared):
        main = torch.npu.current_stream()
        h = x * 2                                   # written on the capture stream
        if wait_before:
            side.wait_stream(main)
        with torch.npu.stream(side):
            shared = h @ w_shared                   # read on the side stream
        routed = h @ w_routed
        if wait_after:
            main.wait_stream(side)
        return routed + shared
    return block


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 16, generator=g).npu(), torch.randn(16, 16, generator=g).npu(),
            torch.randn(16, 16, generator=g).npu()]


def _expected(x, wr, ws):
    h = x.cpu() * 2
    return h @ wr.cpu() + h @ ws.cpu()


@pytest.mark.parametrize("mode", MODES)
def test_side_stream_with_waits_is_clean_and_runs_on_the_users_stream(npugraph, mode):
    side = torch.npu.Stream()
    step = compile_in(mode, shared_expert(side, True, True))
    args = _inputs()
    for _ in range(2):
        assert torch.allclose(step(*args).cpu(), _expected(*args), atol=1e-5)
    (record,) = npugraph.graphs
    assert record.replays == 2
    side_label = stream_label(npugraph, kernels(npugraph, "mm", graph="#replay2")[0])
    assert side_label == npugraph.trace.streams[side._state.sid].label     # the user's own stream
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_side_stream_reading_capture_stream_data_without_a_wait_is_a_race(npugraph, mode):
    side = torch.npu.Stream()
    step = compile_in(mode, shared_expert(side, False, True))
    with npugraph.expect("race", match=r"aten::mul"):
        step(*_inputs())


@pytest.mark.parametrize("mode", MODES)
def test_side_stream_result_returned_without_a_join_is_ordered_by_the_closure(npugraph, mode):
    """The event closure joins every user stream before the output: a side-stream result returned
    without the final ``wait_stream`` is still ordered before the caller reads it."""
    side = torch.npu.Stream()

    def block(x, w):
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            shared = (x * 2) @ w
        return shared

    x, w = _inputs()[:2]
    assert torch.allclose(compile_in(mode, block)(x, w).cpu(), (x.cpu() * 2) @ w.cpu(), atol=1e-5)
    hb = HappensBefore(npugraph.trace)
    side_mm = kernels(npugraph, "mm", graph="#replay1")[0]
    out_read = kernels(npugraph, "_to_copy")[-1]
    assert hb.ordered(side_mm.seq, out_read.seq)
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_main_stream_reading_the_side_result_without_a_join_is_a_race(npugraph, mode):
    side = torch.npu.Stream()
    step = compile_in(mode, shared_expert(side, True, False))
    with npugraph.expect("race", match=r"aten::add"):
        step(*_inputs())


@pytest.mark.parametrize("mode", ["npugraph_ex", "reduce-overhead"])
def test_event_closure_forks_each_user_stream_from_one_record_and_joins_it_before_the_output(npugraph, mode):
    side = torch.npu.Stream()
    compile_in(mode, shared_expert(side, True, True))(*_inputs())
    (record,) = npugraph.graphs
    graph = list(record.fx_graph.graph.nodes)
    ns = "npugraph_ex" if mode == "npugraph_ex" else "air"
    fork = [n for n in graph if str(n.target) == f"{ns}.tagged_event_record.default"][0]
    (wait_on,) = nodes(record, "tagged_event_wait_on_stream")
    (join_record,) = nodes(record, "tagged_event_record_on_stream")
    sid = str(side.stream_id)
    assert fork.args == (f"{record.name}_arg0_1", True) and wait_on.args[:2] == (fork.args[0], sid)
    assert join_record.args[0] == f"{record.name}_stream_id_{sid}_device_index_0_device_type_20"
    assert graph[-2].target.name() == f"{ns}::tagged_event_wait" and graph[-2].args == (join_record.args[0], True)
    (enter,) = nodes(record, "scope_enter")
    keys, values = enter.args
    assert keys == ["_user_stream_label", "_user_stream_priority", "_user_stream_id", "_user_stream_device_index",
                    "_user_stream_device_type"]
    assert values[0].startswith("graph_0_") and values[1:] == ["0", sid, "0", "20"]
    waits = nodes(record, "tagged_stream_wait_stream")
    assert len(waits) == 2 and waits[0].args[:3] == (sid, "0", "20")    # side waits for the graph's stream
    assert str(waits[0].args[3].target) == "<class 'str'>"                 # resolved at run time


@pytest.mark.parametrize("mode", ["npugraph_ex", "reduce-overhead"])
def test_events_made_and_used_inside_the_region(npugraph, mode):
    side = torch.npu.Stream()

    def f(x):
        done = torch.npu.Event()
        start = torch.npu.current_stream().record_event()
        y = x + 1
        with torch.npu.stream(side):
            side.wait_event(start)
            z = x * 3
            done.record()
        done.wait()
        return y + z

    out = compile_in(mode, f)(torch.ones(4, device="npu"))
    assert out.cpu().tolist() == [5.0] * 4
    (record,) = npugraph.graphs
    assert len(nodes(record, "tagged_event_record")) >= 2 and nodes(record, "tagged_event_wait_on_stream")
    npugraph.assert_clean()


def test_event_record_without_the_wait_leaves_the_race(npugraph):
    side = torch.npu.Stream()

    def f(x):
        ready = torch.npu.Event()
        y = x + 1
        ready.record()
        with torch.npu.stream(side):
            z = y * 3                         # no ready.wait(): y is read unordered
        torch.npu.current_stream().wait_stream(side)
        return z

    with npugraph.expect("race"):
        compile_in("npugraph_ex", f)(torch.ones(4, device="npu"))


def test_stream_left_set_at_the_end_is_torchairs_error(npugraph):
    side = torch.npu.Stream()

    def f(x):
        torch.npu.set_stream(side)
        return x + 1

    with pytest.raises(Exception, match="When use npugraph_ex, you must make sure at the end of your code set stream "
                                        "to the same stream as the begin of your code"):
        compile_in("npugraph_ex", f)(torch.ones(2, device="npu"))


def test_set_stream_back_to_the_entry_stream_closes_the_scope(npugraph):
    side = torch.npu.Stream()

    def f(x):
        entry = torch.npu.current_stream()
        side.wait_stream(entry)
        torch.npu.set_stream(side)
        y = x * 2
        torch.npu.set_stream(entry)
        entry.wait_stream(side)
        return y + 1

    assert compile_in("npugraph_ex", f)(torch.ones(2, device="npu")).cpu().tolist() == [3.0, 3.0]
    (record,) = npugraph.graphs
    assert len(nodes(record, "scope_enter")) == len(nodes(record, "scope_exit")) == 1
    npugraph.assert_clean()


def test_record_stream_becomes_a_tagged_record(npugraph):
    side = torch.npu.Stream()

    def f(x):
        y = x + 1
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            z = y * 2
        y.record_stream(side)
        torch.npu.current_stream().wait_stream(side)
        return z

    assert compile_in("npugraph_ex", f)(torch.ones(2, device="npu")).cpu().tolist() == [4.0, 4.0]
    (record,) = npugraph.graphs
    (tagged,) = nodes(record, "record_tagged_on_stream")
    assert tagged.args[1:] == (str(side.stream_id), "0", "20")
    npugraph.assert_clean()


def test_dynamo_graph_of_native_stream_code_uses_torch_npus_patch(npugraph):
    seen = []

    def backend(gm, inputs, **kwargs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("npugraph_ex")(gm, inputs, **kwargs)

    side = torch.npu.Stream()

    def f(x):
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            y = x + 1
        torch.npu.current_stream().wait_stream(side)
        return y

    torch.compile(f, backend=backend, fullgraph=True)(torch.ones(2, device="npu"))
    assert any("set_stream" in t for t in seen) and any("current_stream" in t for t in seen)


def test_hazard_report_names_the_users_lines(npugraph):
    side = torch.npu.Stream()
    step = compile_in("npugraph_ex", shared_expert(side, False, True))
    with npugraph.expect("race"):
        step(*_inputs())
    (race,) = analyze(npugraph.trace, kinds=["race"])
    first = shared_expert.__code__.co_firstlineno
    assert race.where[:2] == [f"tests/graph/test_native_streams.py:{first + 3}",
                              f"tests/graph/test_native_streams.py:{first + 7}"]


# ------------------------------------------------------------ the other checks in npugraph_ex
def test_kept_output_read_after_a_later_call_is_output_overwrite(npugraph):
    step = compile_in("npugraph_ex", lambda x: x * 2)
    kept = step(torch.ones(4, device="npu"))
    step(torch.full((4,), 3.0, device="npu"))
    with npugraph.expect("output-overwrite", match="clone_output|enable_output_clone"):
        assert kept.cpu().tolist() == [6.0] * 4           # the stale buffer holds the second call's result


def test_clone_output_keeps_outputs_the_callers(npugraph):
    step = compile_in("npugraph_ex", lambda x: x * 2, clone_output=True)
    kept = step(torch.ones(4, device="npu"))
    step(torch.full((4,), 3.0, device="npu"))
    assert kept.cpu().tolist() == [2.0] * 4
    npugraph.assert_clean()


@pytest.mark.npu_cores(aicore=24, vector=48)
def test_limit_core_num_out_of_range_in_a_compiled_region_is_core_limit(npugraph):
    def f(x, w):
        with torch.npu.npugraph_ex.scope.limit_core_num(64, 48):
            return x @ w

    with npugraph.expect("core-limit", match="64"):
        compile_in("npugraph_ex", f)(torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu"))


@pytest.mark.npu_cores(aicore=24, vector=48)
def test_limit_core_num_in_range_limits_the_graphs_kernels_and_is_clean(npugraph):
    def f(x, w):
        with torch.npu.npugraph_ex.scope.limit_core_num(8, 16):
            y = x @ w
        return y + 1

    step = compile_in("npugraph_ex", f)
    assert step(torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu")).cpu().tolist() == [[5.0] * 4] * 4
    (record,) = npugraph.graphs
    assert nodes(record, "set_stream_limit") and not nodes(record, "scope_enter")
    npugraph.assert_clean()


# ------------------------------------------------- reinplace: npugraph_ex's event-aware checker
def _reinplace_block(side, back: bool):
    def block(x, w):
        a = x * 2
        side.wait_stream(torch.npu.current_stream())
        done = torch.npu.Event()
        with torch.npu.stream(side):
            s = a @ w                              # reads a on the side stream
            done.record()
        if back:
            done.wait()                            # the main stream waits for the side read
        b = a.add(1)                               # reinplace candidate: add -> add_ on a
        torch.npu.current_stream().wait_stream(side)
        return s, b
    return block


def _verdicts(npugraph):
    from pytest_npugraph import trace as T

    return [r.verdict.verdict for r in npugraph.trace.records if isinstance(r, T.Reinplace)]


def test_npugraph_ex_applies_the_reinplace_when_events_order_the_other_streams_user(npugraph):
    s, b = compile_in("npugraph_ex", _reinplace_block(torch.npu.Stream(), back=True))(
        torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu"))
    assert s.cpu().tolist() == [[8.0] * 4] * 4 and b.cpu().tolist() == [[3.0] * 4] * 4
    assert _verdicts(npugraph) == ["applied"]
    assert any(k.op == "aten::add_.Tensor" for k in kernels(npugraph, graph="#replay1"))
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", ["npugraph_ex", "reduce-overhead"])
def test_reinplace_is_vetoed_when_nothing_orders_the_other_streams_user(npugraph, mode):
    with npugraph.expect("reinplace-conflict", match="pay a copy"):
        s, b = compile_in(mode, _reinplace_block(torch.npu.Stream(), back=False))(
            torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu"))
    assert b.cpu().tolist() == [[3.0] * 4] * 4
    assert _verdicts(npugraph) == ["vetoed"]


def test_torchair_modes_keep_the_label_only_check_even_with_events(npugraph):
    """TorchAir's checker looks at stream labels only: the event back does not help there."""
    with npugraph.expect("reinplace-conflict", match="pay a copy"):
        compile_in("reduce-overhead", _reinplace_block(torch.npu.Stream(), back=True))(
            torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu"))
    assert _verdicts(npugraph) == ["vetoed"]


@pytest.mark.parametrize("record", [False, True], ids=["no-record_stream", "record_stream"])
def test_graph_memory_reused_while_the_side_stream_may_read_it(npugraph, record):
    """``h`` dies on the graph's stream while the side stream may still read it: without
    ``h.record_stream(side)`` the graph pool hands its memory to the next allocation (a race)."""
    side = torch.npu.Stream()

    def f(x, w):
        h = x * 2
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            s = h @ w
        if record:
            h.record_stream(side)
        t = (x + 1) @ w                      # same size as h: takes its memory when h is free
        torch.npu.current_stream().wait_stream(side)
        return s + t

    x, w = torch.ones(8, 8, device="npu"), torch.ones(8, 8, device="npu")
    if record:
        assert compile_in("npugraph_ex", f)(x, w).cpu().tolist() == [[32.0] * 8] * 8
        npugraph.assert_clean()
    else:
        with npugraph.expect("race", match="changed owner"):
            compile_in("npugraph_ex", f)(x, w)
