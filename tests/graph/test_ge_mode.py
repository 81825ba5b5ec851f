"""GE mode (max-autotune): per-op streams, compiler-synchronised data edges, npu_wait_tensor control
edges, per-op core limits, and the checks the real compiler makes (torchair_api.md §1.3, §7.1, §7.4;
ST torchair_scope_st.py / torchair_st.py / torchair_aclgraph_st.py GE cases)."""
import inspect

import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from torchair import scope

from pytest_npugraph import trace as T
from pytest_npugraph.analysis.happens_before import HappensBefore

from .helpers import compile_with, config, kernels, records, stream_label


def _line(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_ops_run_on_their_tags_stream_and_cross_stream_edges_are_synchronised(npugraph):
    def f(x, y):
        a = x + 1
        with scope.npu_stream_switch("s"):
            c = y - 1              # no data edge from the main stream
            b = a * 2              # reads a (main -> s)
        with scope.npu_stream_switch("s"):
            d = c * 3              # same tag: same stream, no event
        return b + d               # reads b and d (s -> main)

    x, y = torch.ones(4, device="npu"), torch.ones(4, device="npu")
    out = compile_with(f)(x, y)
    assert out.cpu().tolist() == [4.0] * 4
    ran = [k for k in kernels(npugraph) if stream_label(npugraph, k).startswith("npu:0/f:")]   # the graph's streams
    assert [k.op for k in ran] == ["aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::mul.Tensor",
                                   "aten::add.Tensor"]
    add, sub, mul, mul2, add2 = ran
    side, main = stream_label(npugraph, mul), stream_label(npugraph, add)
    assert side.endswith(":tag 's'") and main.endswith(":main")
    assert {stream_label(npugraph, k) for k in (sub, mul2)} == {side} and stream_label(npugraph, add2) == main
    # one event per cross-stream data edge: add -> mul, mul -> add2, mul2 -> add2
    edges = [r for r in records(npugraph, T.EventRecord) if "edge" in npugraph.trace.events[r.event].label]
    assert len(edges) == 3
    hb = HappensBefore(npugraph.trace)
    assert hb.ordered(add.seq, mul.seq) and hb.ordered(mul2.seq, add2.seq)
    assert not hb.ordered(add.seq, sub.seq)          # no data edge: GE may run them at once
    # the graph is ordered after earlier work on the launching stream, and later work after it
    fill = kernels(npugraph, "fill_")[0]
    read = kernels(npugraph, "_to_copy")[-1]
    assert hb.ordered(fill.seq, sub.seq) and hb.ordered(add2.seq, read.seq)
    assert (mul.site.line, add2.site.line) == (_line(f, "b = a * 2"), _line(f, "return b + d"))
    (record,) = npugraph.graphs
    assert record.mode == "max-autotune" and record.runs == 1
    assert record.stream_of("aten.sub") == "s" and record.stream_of("aten.add") is None
    npugraph.assert_clean("race", "event-misuse")


def test_wait_tensor_orders_the_users_of_its_tensor_after_the_dependency(npugraph):
    def f(x, y):
        a = x * 2
        with scope.npu_stream_switch("1"):
            scope.npu_wait_tensor(y, a)          # result discarded, as real code does
            b = y + 1
        return a, b

    def g(x, y):
        a = x * 2
        with scope.npu_stream_switch("1"):
            b = y + 1
        return a, b

    x, y = torch.ones(4, device="npu"), torch.ones(4, device="npu")
    compile_with(f)(x, y)
    compile_with(g)(x, y)
    hb = HappensBefore(npugraph.trace)
    (mul_f, mul_g), (add_f, add_g) = kernels(npugraph, "aten::mul"), kernels(npugraph, "aten::add")
    assert hb.ordered(mul_f.seq, add_f.seq)
    assert not hb.ordered(mul_g.seq, add_g.seq)
    assert npugraph.graphs[0].count("air.wait_tensor") == 1


def test_limit_core_num_is_per_op_innermost_wins_and_strings_are_accepted(npugraph):
    # ST test_super_core_num (strings), test_nested_core_num
    def f(x):
        a = x + 1
        with scope.limit_core_num("4", "8"):
            b = a * 2
            with scope.limit_core_num(2, 3):
                c = b - 1
            d = c * 3
        return d + a

    compile_with(f)(torch.ones(4, device="npu"))
    limits = [(k.op, k.cube_limit, k.vector_limit) for k in kernels(npugraph, graph="")[1:6]]
    full = (0, 0)       # no limit
    assert limits == [("aten::add.Tensor", *full), ("aten::mul.Tensor", 4, 8), ("aten::sub.Tensor", 2, 3),
                      ("aten::mul.Tensor", 4, 8), ("aten::add.Tensor", *full)]


def test_ge_config_aicore_num_is_the_graphs_limit_and_op_limits_win(npugraph):
    cfg = config()
    cfg.ge_config.aicore_num = "12|100"          # clamped to the chip's vector cores

    def f(x):
        with scope.limit_core_num(2, 4):
            y = x * 2
        return y + 1

    compile_with(f, cfg)(torch.ones(4, device="npu"))
    mul, add = kernels(npugraph, graph="")[1:3]
    assert (mul.cube_limit, mul.vector_limit) == (2, 4)
    assert (add.cube_limit, add.vector_limit) == (12, npugraph.vector_cores)


def test_tagged_events_are_rejected_when_the_graph_is_converted(npugraph):
    # ST test_ge_with_multi_stream_event
    event = torchair.ops.npu_create_tagged_event(tag="ge")

    def f(x):
        y = x + 1
        torchair.ops.npu_tagged_event_record(event)
        return y

    with pytest.raises(Exception, match=r"torch\.ops\.air\.tagged_event_record\.default ge_converter is not "
                                        r"implemented!") as info:
        compile_with(f)(torch.ones(2, device="npu"))
    assert isinstance(info.value.__cause__ or info.value, (NotImplementedError, torch._dynamo.exc.BackendCompilerFailed))


def test_graph_break_inside_a_scope_is_an_unpaired_scope_error(npugraph):
    def f(x):
        with scope.npu_stream_switch("1"):
            y = x + 1
            torch._dynamo.graph_break()
            z = y * 2
        return z

    with pytest.raises(Exception, match=r"After you call the torch\.ops\.air\.scope_enter operator, there is no "
                                        r"paired call to the torch\.ops\.air\.scope_exit operator\. The parameters "
                                        r"for these torch\.ops\.air\.scope_enter calls are:\[\(\['_user_stream_label'"):
        compile_with(f, fullgraph=False)(torch.ones(2, device="npu"))


@pytest.mark.parametrize("drop, message", [
    ("scope_enter", r"When you call the torch\.ops\.air\.scope_exit operator: scope_exit, you must first call the "
                    r"torch\.ops\.air\.scope_enter operator, as they must be called in pairs\. Please check your code "
                    r"or your post_grad_custom_pre_pass post_grad_custom_post_pass!This error may also occur in a "
                    r"Dynamo graph break scenario\."),
    ("scope_exit", r"After you call the torch\.ops\.air\.scope_enter operator, there is no paired call"),
])
def test_custom_pass_breaking_scope_pairs_is_rejected(npugraph, drop, message):
    # ST torchair_st.py test_miss_scope_enter / test_miss_scope_exit
    def remove(gm, example_inputs, cfg):
        for node in list(gm.graph.nodes):
            if str(node.target) == f"air.{drop}.default":
                gm.graph.erase_node(node)

    cfg = config()
    cfg.post_grad_custom_post_pass = remove

    def f(x):
        with scope.super_kernel("sk"):
            return x + 1

    with pytest.raises(Exception, match=message):
        compile_with(f, cfg)(torch.ones(2, device="npu"))


def test_super_kernel_scope_ops_pair_by_name_in_any_order(npugraph):
    def ok(x):
        torch.npu.super_kernel_scope_begin("a")
        torch.npu.super_kernel_scope_begin("b")
        y = x + 1
        torch.npu.super_kernel_scope_end("a")
        torch.npu.super_kernel_scope_end("b")
        return y

    def bad(x):
        torch.npu.super_kernel_scope_begin("a")
        y = x + 1
        torch.npu.super_kernel_scope_end("c")
        return y

    assert compile_with(ok)(torch.ones(2, device="npu")).cpu().tolist() == [2.0, 2.0]
    with pytest.raises(Exception, match=r"No matching torch\.npu\.super_kernel_scope_begin found for "
                                        r"torch\.npu\.super_kernel_scope_end operator 'super_kernel_scope_end' with "
                                        r"scope_name='c'\. Available unmatched scope_names are: \['a'\]\."):
        compile_with(bad)(torch.ones(2, device="npu"))
    with pytest.raises(RuntimeError, match="scope_name should be None or a non-empty string."):
        torch.npu.super_kernel_scope_begin("  ")


def test_scope_attributes_per_node_follow_torchairs_apply(npugraph):
    # ST test_super_kernel_scope_none: an inner super_kernel(None) cancels the outer scope
    from pytest_npugraph.compiler import fxgraph

    graphs = []
    cfg = config()
    cfg.post_grad_custom_post_pass = lambda gm, inputs, c: graphs.append(fxgraph.scopes(gm))

    def f(x):
        with scope.super_kernel("outer"):
            a = x + 1
            with scope.super_kernel(None):
                b = a * 2
                with scope.super_kernel("inner"), scope.npu_stream_switch("2"):
                    c = b - 1
        return c

    compile_with(f, cfg)(torch.ones(2, device="npu"))
    by_name = {node.name: s for node, s in graphs[0].items()}
    assert by_name["add"].super_kernel == "outer"
    assert by_name["mul"].super_kernel is None
    assert (by_name["sub"].super_kernel, by_name["sub"].stream) == ("inner", "2")


def test_run_eagerly_runs_the_graph_op_by_op_on_the_current_stream(npugraph):
    cfg = config()
    cfg.debug.run_eagerly = True

    def f(x):
        with scope.npu_stream_switch("1"):
            return x * 2

    assert compile_with(f, cfg)(torch.ones(2, device="npu")).cpu().tolist() == [2.0, 2.0]
    assert stream_label(npugraph, kernels(npugraph, "aten::mul")[0]) == "npu:0/default"
    assert npugraph.graphs == []
