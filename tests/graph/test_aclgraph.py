"""reduce-overhead (aclgraph) conformance: TorchAir's own test cases (torchair_api.md §6.3,
tests/st/torchair_aclgraph_st.py and the NPU smoke tests) re-expressed against the emulator, with the
run-time semantics they only stub (capture, replay, pools) checked on values and on the trace."""
import contextlib

import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from torch._dynamo.utils import counters
from torchair import scope

from pytest_npugraph import trace as T
from pytest_npugraph.analysis.happens_before import HappensBefore

from .helpers import compile_with, config, kernels, nodes, records, reduce_overhead, stream_label

RECORD, WAIT = "air.tagged_event_record", "air.tagged_event_wait"


def _run(f, *args, **debug):
    compiled = reduce_overhead(f, **debug)
    return compiled, compiled(*args)


# ----------------------------------------------------------------- event closure (fork/join)
def test_npu_stream_switch_with_stream_closure(npugraph):
    def f(x):
        with scope.npu_stream_switch("1"):
            a = x + 1
            with scope.npu_stream_switch("2"):
                b = x * 2
        return a, b

    _, (a, b) = _run(f, torch.ones(4, device="npu"))
    assert a.cpu().tolist() == b.cpu().tolist() == [2.0] * 4
    (record,) = npugraph.graphs
    names = [n.name for n in record.fx_graph.graph.nodes]
    assert names[0] == "tagged_event_record_default"                    # fork: before the first node
    records_, waits = nodes(record, RECORD), nodes(record, WAIT)
    assert len(records_) == 3 and len(waits) == 4                       # 1 fork + 2 joins; 2 + 2 waits
    assert [n.name for n in waits[-2:]] == ["tagged_event_wait_default_2", "tagged_event_wait_default_3"]
    assert list(record.fx_graph.graph.nodes)[-2] is waits[-1]           # joins right before the output
    assert all(n.args[1] is True for n in records_ + waits)             # created inside
    assert {n.args[0] for n in records_} == {f"{record.name}_{x}" for x in ("arg0_1", "scope_exit", "scope_exit_1")}
    enters = nodes(record, "scope_enter")
    assert all(n.kwargs == {"need_execute": True} for n in enters)
    # at run time: each side stream is forked from the capture stream and joined before capture end
    replay = kernels(npugraph, graph="#replay1")
    assert len({stream_label(npugraph, k) for k in replay}) == 2
    hb = HappensBefore(npugraph.trace)
    add, mul = replay
    assert not hb.ordered(add.seq, mul.seq) and not hb.ordered(mul.seq, add.seq)
    read = kernels(npugraph, "_to_copy")[-2]
    assert hb.ordered(add.seq, read.seq) and hb.ordered(mul.seq, read.seq)
    npugraph.assert_clean("event-misuse", "race")


def test_npu_stream_switch_with_tagged_event(npugraph):
    e1 = torchair.ops.npu_create_tagged_event(tag="33")
    e2 = torchair.ops.npu_create_tagged_event(tag="44")

    def f(x, y):
        a = x + y
        torchair.ops.npu_tagged_event_record(e1)
        with scope.npu_stream_switch("1"):
            torchair.ops.npu_tagged_event_wait(e1)
            b = torch.mm(a, y)
            torchair.ops.npu_tagged_event_record(e2)
            with scope.npu_stream_switch("2"):
                torchair.ops.npu_tagged_event_wait(e2)
                c = torch.mm(b, y)
        return c

    x, y = torch.ones(2, 2, device="npu"), torch.ones(2, 2, device="npu")
    _, out = _run(f, x, y)
    assert out.cpu().tolist() == [[8.0, 8.0], [8.0, 8.0]]
    (record,) = npugraph.graphs
    assert len(nodes(record, RECORD)) == 5        # 2 user records + fork + 2 joins
    # the mm that follows each user wait
    for wait in (n for n in nodes(record, WAIT) if not n.args[1:] or n.args[1] is not True):
        assert "aten.mm" in str(wait.next.target) or "tagged_event_wait" in str(wait.next.target)
    hb = HappensBefore(npugraph.trace)
    mm1, mm2 = kernels(npugraph, "aten::mm", graph="#replay1")
    assert hb.ordered(kernels(npugraph, "aten::add", graph="#replay1")[0].seq, mm1.seq) and hb.ordered(mm1.seq, mm2.seq)
    npugraph.assert_clean("race", "event-misuse")


@pytest.mark.parametrize("inner", ["super_kernel", "limit_core_num"])
def test_npu_stream_switch_with_super_kernel_and_core_limit_scopes(npugraph, inner):
    def f(x):
        with scope.npu_stream_switch("1"):
            with (scope.super_kernel("sk") if inner == "super_kernel" else scope.limit_core_num(4, 8)):
                y = x * 2
        return y

    _run(f, torch.ones(2, device="npu"))
    (record,) = npugraph.graphs
    assert len(nodes(record, RECORD)) == 2         # other scopes add no events
    assert bool(nodes(record, "current_stream")) == (inner == "limit_core_num")


def test_npu_wait_tensor_is_not_supported_in_reduce_overhead(npugraph):
    def f(x, y):
        with scope.npu_stream_switch("1"):
            scope.npu_wait_tensor(x, y)
            return x + 1

    with pytest.raises(NotImplementedError, match="npu_wait_tensor is not support in this mode"):
        _run(f, torch.ones(2, device="npu"), torch.ones(2, device="npu"))


def test_record_stream_with_reduce_over_head(npugraph):
    def f(x):
        with scope.npu_stream_switch("1"):
            y = x * 2
            torchair.ops.npu_record_tagged_stream(y, "1")
        return y, x + 1

    _run(f, torch.ones(2, device="npu"))
    (record,) = npugraph.graphs
    assert len(nodes(record, "air.record_tagged_stream.default")) == 1
    assert records(npugraph, T.RecordStream)                  # recorded at capture, on the host


def test_npu_stream_record_wait(npugraph):
    # ST test_npu_stream_record_wait_with_record_wait: torchair.ops.record/wait order across streams
    def f(x):
        a = x + 1
        r = torchair.ops.record()
        with scope.npu_stream_switch("1"):
            torchair.ops.wait([r, a])
            b = a * 2
        return b

    _, out = _run(f, torch.ones(2, device="npu"))
    assert out.cpu().tolist() == [4.0, 4.0]
    (record,) = npugraph.graphs
    (wait,) = nodes(record, "air.wait.default")
    assert [str(n.target) for n in wait.args[0]] == ["air.record.default", "air.record.default"]
    assert wait.args[0][1].prev.name == "add"                 # a record right after the producer
    npugraph.assert_clean("race")


# ------------------------------------------------------------------------- core limits
def test_limit_core_num_in_aclgraph_becomes_stream_limits(npugraph):
    torch.npu.set_stream_limit(torch.npu.current_stream(), 12, 24)     # inherited by the capture stream

    def f(x):
        a = x + 1
        with scope.limit_core_num(4, 8):
            b = a * 2
            with scope.npu_stream_switch("1"):
                c = x - 1                       # the side stream inherits the enclosing limit
            with scope.limit_core_num(2, 4), scope.super_kernel("sk"):
                d = b * 3
        return d + a, c

    _, (out, side) = _run(f, torch.ones(2, device="npu"))
    assert out.cpu().tolist() == [14.0, 14.0] and side.cpu().tolist() == [0.0, 0.0]
    (record,) = npugraph.graphs
    sets, gets = nodes(record, "set_stream_limit"), nodes(record, "get_stream_limit")
    assert len(sets) == 2 * len(gets) == 6                  # ST invariant: set == 2 x get
    assert not [n for n in nodes(record, "scope_enter") if "_op_aicore_num" in n.args[0]]
    limits = [(k.op, k.cube_limit, k.vector_limit) for k in kernels(npugraph, graph="#replay1")]
    assert limits == [("aten::add.Tensor", 12, 24), ("aten::mul.Tensor", 4, 8), ("aten::sub.Tensor", 4, 8),
                      ("aten::mul_.Tensor", 2, 4), ("aten::add_.Tensor", 12, 24)]   # b, then d, reinplaced
    npugraph.assert_clean("core-limit", "race")


def test_cross_stream_data_needs_explicit_events_in_reduce_overhead_but_not_in_ge_mode(npugraph):
    def f(x):
        with scope.npu_stream_switch("1"):
            y = x * 2
        return y + 1           # reads y on the capture stream: only the join at the end orders them

    assert compile_with(f)(torch.ones(2, device="npu")).cpu().tolist() == [3.0, 3.0]       # GE mode
    npugraph.assert_clean("race")
    with npugraph.expect("race", match=r"aten::mul\.Tensor"):
        assert reduce_overhead(f)(torch.ones(2, device="npu")).cpu().tolist() == [3.0, 3.0]


def test_inherited_global_limit_core_and_recapture_when_it_changes(npugraph):
    stream = torch.npu.current_stream()
    torch.npu.set_stream_limit(stream, 6, 12)
    f, _ = _run(lambda x: x + 1, torch.ones(2, device="npu"))
    (k,) = kernels(npugraph, "aten::add", graph="#replay1")
    assert (k.cube_limit, k.vector_limit) == (6, 12)          # the capture stream inherits it
    f(torch.ones(2, device="npu"))
    torch.npu.set_stream_limit(stream, 8, 16)
    f(torch.ones(2, device="npu"))
    (record,) = npugraph.graphs
    assert (record.captures, record.recaptures, record.replays) == (1, 1, 3)
    assert counters["npugraph_ex"]["recapture_due_to_global_limit_core_change_" + record.name] == 1
    (k,) = kernels(npugraph, "aten::add", graph="#replay1")[-1:]
    assert (k.cube_limit, k.vector_limit) == (8, 16)


# ------------------------------------------------------------------- capture and recapture
def test_capture_and_recapture_cnt(npugraph):
    def f(x, cache):
        cache.add_(x)
        return cache * 2

    compiled = reduce_overhead(f)
    x, c1, c2 = torch.ones(4, device="npu"), torch.zeros(4, device="npu"), torch.zeros(4, device="npu")
    compiled(x, c1)
    compiled(torch.ones(4, device="npu"), c1)      # a user input moved: copied in, no recapture
    name = npugraph.graphs[0].name
    assert (dict(counters["npugraph_ex"]), c1.cpu().tolist()) == ({"captured_" + name: 1}, [2.0] * 4)
    out = compiled(x, c2)                          # a mutated input moved: recapture
    assert dict(counters["npugraph_ex"]) == {"captured_" + name: 1,
                                              "recapture_due_to_mutated_input_change_" + name: 1}
    assert (out.cpu().tolist(), c2.cpu().tolist(), c1.cpu().tolist()) == ([2.0] * 4, [1.0] * 4, [2.0] * 4)
    (record,) = npugraph.graphs
    assert (record.captures, record.recaptures, record.replays, record.runs) == (1, 1, 3, 3)


@pytest.mark.parametrize("frozen", [False, True])
def test_parameter_address_change_is_a_new_key_unless_frozen(npugraph, frozen):
    cfg = config("reduce-overhead")
    cfg.experimental_config.frozen_parameter = frozen
    compiled = compile_with(lambda x, w: x * w, cfg)
    x = torch.ones(4, device="npu")
    w1, w2 = torch.full((4,), 1.0, device="npu"), torch.full((4,), 2.0, device="npu")
    for w in (w1, w2):
        torch._dynamo.mark_static_address(w)     # a parameter-like (static) input
    if frozen:
        with pytest.warns(UserWarning, match="When enable frozen_parameter, Parameters and input tensors with "
                                             "immutable data_ptr marked by `torch._dynamo.mark_static_address"):
            compiled(x, w1)
    else:
        compiled(x, w1)
    out = compiled(x, w2)
    (record,) = npugraph.graphs
    assert record.recaptures == 0 and not [k for k in counters["npugraph_ex"] if k.startswith("recapture")]
    if frozen:      # the new address is silently ignored: the graph still reads w1
        assert (record.captures, out.cpu().tolist()) == (1, [1.0] * 4)
    else:
        assert (record.captures, out.cpu().tolist()) == (2, [2.0] * 4)


def test_aclgraph_static_capture_size_limit(npugraph):
    compiled = compile_with(lambda x: x + 1, config("reduce-overhead", static_capture_size_limit=2), dynamic=True)
    for n in (2, 3):
        compiled(torch.ones(n, device="npu"))
    (record,) = npugraph.graphs
    name = record.name
    assert counters["npugraph_ex"]["captured_" + name] == 2
    with pytest.warns(UserWarning, match=rf"The static_capture_size_limit reached when capturing fx_graph {name} "
                                         r"with graph key \[4\], we will fall back to eager for all subsequent "
                                         r"executions\."):
        out = compiled(torch.ones(4, device="npu"))
    assert out.cpu().tolist() == [2.0] * 4
    compiled(torch.ones(2, device="npu"))          # eager from now on, even for a captured key
    assert record.fallback_to_eager and record.captures == 0 and record.replays == 2
    assert "captured_" + name not in counters["npugraph_ex"]
    assert kernels(npugraph, "aten::add", graph="")[-1].site.path.endswith("test_aclgraph.py")


def test_aclgraph_unsupported_dump(npugraph):
    cfg = config("reduce-overhead")
    cfg.debug.graph_dump.type = "txt"
    with pytest.raises(Exception, match=r"Graph dump for aclGraph only support 'py' type, but got: txt\.Please check "
                                        r"compile config setting: config\.debug\.graph_dump\.type"):
        compile_with(lambda x: x + 1, cfg)(torch.ones(2, device="npu"))


def test_force_eager_with_multi_stream(npugraph):
    cfg = config("reduce-overhead")
    cfg.debug.run_eagerly = True

    def f(x):
        with scope.npu_stream_switch("1"):
            y = x * 2
        return y, x + 1

    y, z = compile_with(f, cfg)(torch.ones(2, device="npu"))
    assert y.cpu().tolist() == [2.0, 2.0] and z.cpu().tolist() == [2.0, 2.0]
    mul, add = kernels(npugraph, graph="")[1:3]
    assert stream_label(npugraph, mul) != stream_label(npugraph, add) == "npu:0/default"
    assert not kernels(npugraph, graph="#") and npugraph.graphs[0].replays == 0
    npugraph.assert_clean("race", "event-misuse")


# ------------------------------------------------------------------------------ pools
def _capture_pools(npugraph):
    return [m.pool for m in records(npugraph, T.CaptureBegin) if m.graph.key is not None]


@pytest.mark.parametrize("custom", [False, True])
def test_aclgraph_dynamic_use_custom_pool(npugraph, custom):
    cfg = config("reduce-overhead")
    if custom:
        cfg.aclgraph_config.use_custom_pool = torch.npu.graph_pool_handle()
    f = compile_with(lambda x: x + 1, cfg)
    g = compile_with(lambda x: x * 2, cfg)
    f(torch.ones(2, device="npu"))
    g(torch.ones(2, device="npu"))
    first, second = _capture_pools(npugraph)
    assert (first == second) == custom
    # a custom pool turns reuse within the FX graph off in the compiler's settings; the user's config stays
    assert cfg.debug.aclgraph.disable_mempool_reuse_in_same_fx.value == "0"


@pytest.mark.parametrize("reuse", [True, False])
def test_graph_keys_of_one_fx_graph_share_memory_unless_disabled(npugraph, reuse):
    compiled = compile_with(lambda x: x * 2 + 1, config("reduce-overhead", disable_mempool_reuse_in_same_fx=not reuse),
                            dynamic=True)
    a = compiled(torch.ones(4, device="npu"))
    b = compiled(torch.ones(6, device="npu"))
    assert (a.data_ptr() == b.data_ptr()) == reuse     # key 2 was captured from the pool's empty state
    # with reuse, key 2's replay wrote over a's bytes: reading a is stale (same values here)
    with npugraph.expect("output-overwrite") if reuse else contextlib.nullcontext():
        assert a.cpu().tolist() == [3.0] * 4 and b.cpu().tolist() == [3.0] * 6
    (record,) = npugraph.graphs
    assert record.keys == ["[4]", "[6]"]


def test_aclgraph_dynamic_output_construct_in_share_memory_warns_once(npugraph):
    compiled = compile_with(lambda x: x + 1, config("reduce-overhead"), dynamic=True)
    compiled(torch.ones(4, device="npu"))
    compiled(torch.ones(6, device="npu"))
    with pytest.warns(UserWarning, match="Because acl graph fixes memory addresses, acl graphs do not have a great way "
                                         "of handling live tensors from a previous invocation"):
        compiled(torch.ones(4, device="npu"))       # key [4] again: its earlier outputs died, rebuilt
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(torch.ones(6, device="npu"))       # once only


# ------------------------------------------------------------------- inputs and outputs
@pytest.mark.parametrize("clone_input", [True, False])
def test_aclgraph_userinput_construct_in_share_memory(npugraph, clone_input):
    compiled = reduce_overhead(lambda x: x * 3, clone_input=clone_input)
    x1 = torch.ones(4, device="npu")
    compiled(x1)
    copies = len(kernels(npugraph, "copy_", graph=""))
    compiled(x1)                                   # same input address
    same = len(kernels(npugraph, "copy_", graph="")) - copies
    x2 = torch.full((4,), 2.0, device="npu")
    out = compiled(x2)
    assert out.cpu().tolist() == [6.0] * 4
    if clone_input:      # copied into the graph's buffer on every call; the user's tensors are untouched
        assert same == 1 and x1.cpu().tolist() == [1.0] * 4
    else:                # copied into the first call's tensor only when the address changed
        assert same == 0 and x1.cpu().tolist() == [2.0] * 4


def test_clone_output_disabled_outputs_are_the_static_buffers(npugraph):
    compiled = reduce_overhead(lambda x: x + 1)
    out1 = compiled(torch.ones(4, device="npu"))
    out2 = compiled(torch.full((4,), 5.0, device="npu"))
    assert out1.data_ptr() == out2.data_ptr()
    with npugraph.expect("output-overwrite"):
        assert out1.cpu().tolist() == [6.0] * 4          # overwritten by the second replay
    graph_writes = {s for k in kernels(npugraph, graph="#replay") for s in k.writes}
    assert any(s.lo == out1.data_ptr() for s in graph_writes)
    # each call's outputs are named in the trace (for the output-overwrite analysis)
    calls = records(npugraph, T.GraphOutputs)
    assert [(m.call.key, m.call.replay, m.spans[0].lo) for m in calls] == \
        [("no_updated_input", 1, out1.data_ptr()), ("no_updated_input", 2, out1.data_ptr())]


def test_npugraph_ex_mode_captures_like_reduce_overhead_without_the_deprecation(npugraph, recwarn):
    compiled = compile_with(lambda x: x + 1, config("npugraph_ex"))
    compiled(torch.ones(2, device="npu"))
    compiled(torch.ones(2, device="npu"))
    (record,) = npugraph.graphs
    assert (record.mode, record.captures, record.replays) == ("npugraph_ex", 1, 2)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning) and "reduce-overhead" in str(w.message)]


@pytest.mark.parametrize("reuse", [True, False])
def test_clone_output_gives_distinct_storage_per_call(npugraph, reuse):
    compiled = reduce_overhead(lambda x, y: (x + 1, y.view(-1)), enable_output_clone=True,
                               disable_mempool_reuse_in_same_fx=not reuse)
    y = torch.ones(2, 2, device="npu")
    out1, alias1 = compiled(torch.ones(4, device="npu"), y)
    out2, alias2 = compiled(torch.full((4,), 5.0, device="npu"), y)
    assert out1.data_ptr() != out2.data_ptr() and out1.cpu().tolist() == [2.0] * 4
    assert alias1.data_ptr() == alias2.data_ptr() == y.data_ptr()     # outputs aliasing inputs are not cloned
    assert kernels(npugraph, "aten::clone", graph="")


def test_one_capture_per_graph_key_and_replays_reuse_it(npugraph):
    compiled = compile_with(lambda x: x.sum(0), config("reduce-overhead"), dynamic=True)
    for n in (2, 3, 2, 3, 2):
        assert compiled(torch.ones(n, 4, device="npu")).cpu().tolist() == [float(n)] * 4
    (record,) = npugraph.graphs
    assert (record.keys, record.captures, record.replays) == (["[2, 4]", "[3, 4]"], 2, 5)   # the shapes
    assert len(records(npugraph, T.CaptureBegin)) == 3   # + the pool's init
