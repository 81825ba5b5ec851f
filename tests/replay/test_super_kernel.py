"""super-kernel: SuperKernel scope misuse and early start (docs/reference.md "Hazards", issue 6; torchair_api.md §1.3-1.4,
§7.8; torch_npu_api.md §4.3; seed 004).  An op whose profile sets ``set_next_task_start`` calls
SetNextTaskStart: the next sub-kernel of its SuperKernel may start before it finishes.  Catches the
next sub-kernel reading or overwriting its output in GE mode (``torchair.scope.super_kernel``), in
reduce-overhead and in an eager ``torch.npu.graph`` capture (``torch.npu.super_kernel_scope_begin/end``);
unpaired scopes outside compiled graphs; warnings for an early-start op in no scope and for a
multi-stream scope without stream-fusion.  Silent with an independent op between the two, without
the profile flag, and with ``stream-fusion=1``."""
import pytest
import torch
import torch_npu
from torchair import scope

from graph.helpers import compile_with, config, reduce_overhead

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import analyze

EARLY = {"kind": "AIV", "set_next_task_start": True}


def hazards(npugraph):
    return analyze(npugraph.trace, kinds=["super-kernel"])


@pytest.fixture
def early_mul(op_profiles):
    op_profiles["mul"] = EARLY
    return op_profiles


def ge_consumer_next(x):
    with scope.super_kernel("decode"):
        a = x * 2                    # calls SetNextTaskStart
        return a + 1                 # the next sub-kernel reads a


def ge_independent_between(x, y):
    with scope.super_kernel("decode"):
        a = x * 2
        b = y - 1                    # does not touch a: it is the one that starts early
        return a + b


def test_ge_next_sub_kernel_reading_the_early_start_output(npugraph, early_mul):
    with npugraph.expect("super-kernel"):
        out = compile_with(ge_consumer_next)(torch.ones(4, device="npu"))
    assert out.cpu().tolist() == [3.0] * 4
    (h,) = hazards(npugraph)
    first = ge_consumer_next.__code__.co_firstlineno
    assert h.where == [f"tests/replay/test_super_kernel.py:{first + 2}", f"tests/replay/test_super_kernel.py:{first + 3}"]
    assert h.ops == ["aten::mul.Tensor", "aten::add.Tensor"] and h.severity == "error"
    assert "SetNextTaskStart" in h.message and "'decode'" in h.message and "reads" in h.message
    assert "last write" in h.message
    # the scope is named by its `with` line, not by the first op in it
    assert f"(opened at tests/replay/test_super_kernel.py:{first + 1})" in h.message


def test_ge_next_sub_kernel_overwriting_the_early_start_output(npugraph, early_mul):
    def f(x):
        with scope.super_kernel("decode"):
            a = x * 2
            a.add_(1)
            return a

    with npugraph.expect("super-kernel", match="reads|overwrites"):
        compile_with(f)(torch.ones(4, device="npu"))


def test_ge_silent_with_an_independent_op_between(npugraph, early_mul):
    out = compile_with(ge_independent_between)(torch.ones(4, device="npu"), torch.ones(4, device="npu"))
    assert out.cpu().tolist() == [2.0] * 4
    npugraph.assert_clean()


def test_ge_silent_without_the_profile_flag_or_outside_a_scope_consumer(npugraph, op_profiles):
    op_profiles["mul"] = {"kind": "AIV"}
    compile_with(ge_consumer_next)(torch.ones(4, device="npu"))
    npugraph.assert_clean()


@pytest.mark.parametrize("kind", ["AICPU", "ATB"])
def test_ge_unfusable_op_splits_the_super_kernel(npugraph, early_mul, kind):
    """An op GE cannot fuse (AICPU, ATB) closes the SuperKernel and runs on its own, with the usual
    sync: reading the early-start output there is fine; the next op opens a new SuperKernel."""
    early_mul["add"] = {"kind": kind}

    def f(x):
        with scope.super_kernel("decode"):
            a = x * 2                    # calls SetNextTaskStart
            b = a + 1                    # unfusable: a task of its own after the SuperKernel
            return b - 1                 # a new SuperKernel "decode"

    assert compile_with(f)(torch.ones(4, device="npu")).cpu().tolist() == [2.0] * 4
    marks = [(r.what, r.name) for r in npugraph.trace.records
             if isinstance(r, (T.SuperKernelBegin, T.SuperKernelEnd))]
    assert marks == [("super_kernel_begin", "decode"), ("super_kernel_end", "decode")] * 2
    npugraph.assert_clean()


@pytest.mark.parametrize("collective, fusable", [("all_reduce", True), ("reduce_scatter_tensor", True),
                                                 ("all_gather_into_tensor", True), ("broadcast", False)])
def test_ge_fuses_only_the_documented_collectives(npugraph, op_profiles, collective, fusable):
    from pytest_npugraph.runtime.runtime import current
    from pytest_npugraph.compiler import ge

    op_profiles[collective] = {"kind": "HCCL"}
    node = torch.fx.Graph().call_function(getattr(torch.ops._c10d_functional, collective).default, ())
    assert ge._fusable(node, current(), 0) is fusable


def test_ge_consumer_after_the_scope_is_not_a_sub_kernel(npugraph, early_mul):
    def f(x):
        with scope.super_kernel("decode"):
            a = x * 2
        return a + 1                 # a separate task after the SuperKernel

    compile_with(f)(torch.ones(4, device="npu"))
    npugraph.assert_clean()


def test_early_start_op_outside_any_scope_is_a_warning(npugraph, early_mul):
    with npugraph.expect("super-kernel", match="outside any SuperKernel scope"):
        (torch.ones(4, device="npu") * 2).cpu()
    (h,) = hazards(npugraph)
    assert h.severity == "warning"


def test_torchair_scope_has_no_effect_in_reduce_overhead(npugraph, early_mul):
    # torchair_api.md §1.4 item 5: super_kernel scopes are ignored in aclgraph mode
    step = reduce_overhead(ge_consumer_next)
    with npugraph.expect("super-kernel", match="outside any SuperKernel scope"):
        step(torch.ones(4, device="npu"))
    assert {h.severity for h in hazards(npugraph)} == {"warning"}


def test_ge_multi_stream_scope_needs_stream_fusion(npugraph):
    def f(options):
        def body(x):
            with scope.super_kernel("sk", options):
                a = x + 1
                with scope.npu_stream_switch("1"):
                    b = x * 3
                return a + b
        return body

    with npugraph.expect("super-kernel", match="several streams.*stream-fusion=1"):
        compile_with(f(""))(torch.ones(4, device="npu"))
    assert [h.severity for h in hazards(npugraph)] == ["warning"]
    torch._dynamo.reset()
    start = len(npugraph.trace)
    compile_with(f("stream-fusion=1"))(torch.ones(4, device="npu"))
    assert [h for h in hazards(npugraph) if h.seqs[0] >= start] == []


def aclgraph_consumer_next(x):
    torch.npu.super_kernel_scope_begin("decode")
    a = x * 2
    b = a + 1
    torch.npu.super_kernel_scope_end("decode")
    return b


def aclgraph_independent_between(x, y):
    torch.npu.super_kernel_scope_begin("decode")
    a = x * 2
    b = y - 1
    c = a + b
    torch.npu.super_kernel_scope_end("decode")
    return c


def test_reduce_overhead_scope_ops_catch_it_on_replay(npugraph, early_mul):
    step = reduce_overhead(aclgraph_consumer_next)
    with npugraph.expect("super-kernel", match="'decode'.*SetNextTaskStart"):
        for _ in range(2):
            assert step(torch.ones(4, device="npu")).cpu().tolist() == [3.0] * 4
    (h,) = hazards(npugraph)             # one report for every replay
    first = aclgraph_consumer_next.__code__.co_firstlineno
    assert h.where == [f"tests/replay/test_super_kernel.py:{first + 2}", f"tests/replay/test_super_kernel.py:{first + 3}"]


def test_reduce_overhead_silent_with_an_independent_op_between(npugraph, early_mul):
    step = reduce_overhead(aclgraph_independent_between)
    for _ in range(2):
        assert step(torch.ones(4, device="npu"), torch.ones(4, device="npu")).cpu().tolist() == [2.0] * 4
    npugraph.assert_clean()


def test_eager_capture_catches_it_and_stays_silent_with_the_op_between(npugraph, early_mul):
    x, y = torch.ones(4, device="npu"), torch.ones(4, device="npu")
    buggy, fixed = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with torch.npu.graph(buggy):
        out = aclgraph_consumer_next(x)
    with torch.npu.graph(fixed):
        aclgraph_independent_between(x, y)
    fixed.replay()
    npugraph.assert_clean()
    with npugraph.expect("super-kernel", match="reads"):
        buggy.replay()
    assert out.cpu().tolist() == [3.0] * 4


def test_unpaired_scope_ops_outside_compiled_graphs(npugraph):
    with npugraph.expect("super-kernel", match=r"super_kernel_scope_end\('a'\).*no open super_kernel_scope_begin"):
        torch.npu.super_kernel_scope_end("a")
    with npugraph.expect("super-kernel", match=r"super_kernel_scope_begin\('b'\) .* is never ended"):
        torch.npu.super_kernel_scope_begin("b")
        (torch.ones(4, device="npu") + 1).cpu()
    assert [h.severity for h in hazards(npugraph)] == ["error", "error"]


def test_scopes_of_different_names_may_nest(npugraph, early_mul):
    # pairing is by name in any order (torchair _valid_graph); the innermost scope holds the kernels
    torch.npu.super_kernel_scope_begin("outer")
    x = torch.ones(4, device="npu")
    torch.npu.super_kernel_scope_begin("inner")
    y = x * 2
    torch.npu.super_kernel_scope_end("outer")
    torch.npu.super_kernel_scope_end("inner")
    z = y + 1                        # not a sub-kernel any more
    assert z.cpu().tolist() == [3.0] * 4
    npugraph.assert_clean()
