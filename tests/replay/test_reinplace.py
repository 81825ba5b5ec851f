"""reinplace-conflict: TorchAir's reinplace passes vetoed by multi-stream users (docs/reference.md "Hazards", issue 6;
torchair_api.md §4.1 steps 7-8, §4.9, §7.12).  A functional op whose mutated tensor has users on
more than one stream label keeps its copy (warning), in reduce-overhead and in TorchAir's npugraph_ex
mode alike, even when tagged events order the users; an applied reinplace whose in-place write races
with a read through a view on another stream is an error; silent on one stream, with an event back
from the reading stream, with the pass switched off, and in GE mode.  The user's own in-place op on
a tensor another stream reads is a race."""
import pytest
import torch
import torch_npu
import torchair as tng

from graph.helpers import compile_with, config

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import analyze


def hazards(npugraph):
    return analyze(npugraph.trace, kinds=["reinplace-conflict"])


def verdicts(npugraph):
    return [r.verdict.verdict for r in npugraph.trace.records if isinstance(r, T.Reinplace)]


def ops_run(npugraph):
    """The ops the replays ran (an applied reinplace shows as the in-place op)."""
    return {k.op for k in npugraph.trace.records if isinstance(k, T.Kernel) and k.graph}


class SideRead(torch.nn.Module):
    """``a`` is read on stream '1' (after a tagged event) and then updated out of place on main."""

    def __init__(self, side=True, back=False):
        super().__init__()
        self.side, self.back = side, back
        self.ready = tng.ops.npu_create_tagged_event(tag="ri_ready")
        self.done = tng.ops.npu_create_tagged_event(tag="ri_done")

    def forward(self, x, w):
        a = x * 2
        tng.ops.npu_tagged_event_record(self.ready)
        if self.side:
            with tng.scope.npu_stream_switch("1"):
                tng.ops.npu_tagged_event_wait(self.ready)
                s = a @ w                                      # reads a on stream '1'
                tng.ops.npu_tagged_event_record(self.done)
        else:
            s = a @ w
        if self.back:
            tng.ops.npu_tagged_event_wait(self.done)
        b = a.add(1)                                           # reinplace candidate: add -> add_
        return s, b


def inputs():
    return torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu")


def run(model, mode="reduce-overhead", **debug):
    step = compile_with(model, config(mode, **debug))
    return step(*inputs())


def test_multi_stream_users_veto_the_reinplace_warning(npugraph):
    with npugraph.expect("reinplace-conflict", match=r"multi-stream disables it for node add"):
        s, b = run(SideRead(back=True))
    assert b.cpu().tolist() == [[3.0] * 4] * 4 and s.cpu().tolist() == [[8.0] * 4] * 4
    (h,) = hazards(npugraph)
    first = SideRead.forward.__code__.co_firstlineno
    assert h.severity == "warning"
    assert h.where[0] == f"tests/replay/test_reinplace.py:{first + 12}"           # the add
    assert f"tests/replay/test_reinplace.py:{first + 6}" in h.where               # the side read
    assert h.streams == ["1", "main"] or set(h.streams) == {"1", "main"}
    assert "disable_reinplace_inplaceable_ops_pass" in h.message and "pay a copy" in h.message


def test_single_stream_reinplace_is_silent(npugraph):
    run(SideRead(side=False))
    assert hazards(npugraph) == []
    assert verdicts(npugraph) == ["applied"]
    npugraph.assert_clean()


def test_pass_disabled_by_config_is_silent(npugraph):
    run(SideRead(back=True), disable_reinplace_inplaceable_ops_pass=True)
    assert hazards(npugraph) == []
    npugraph.assert_clean()


@pytest.mark.parametrize("back", [False, True], ids=["unordered", "event-ordered"])
def test_torchairs_npugraph_ex_mode_runs_the_same_label_check(npugraph, back):
    """TorchAir's ``mode="npugraph_ex"`` uses TorchAir's ReinplaceStreamChecker (labels only); the
    event-aware check belongs to the standalone npugraph_ex backend."""
    with npugraph.expect("reinplace-conflict", match="pay a copy"):
        run(SideRead(back=back), mode="npugraph_ex")
    assert verdicts(npugraph) == ["vetoed"]


class OwnInplace(torch.nn.Module):
    """The user's own ``x.add_`` on main while stream '1' reads ``x`` with no event between them."""

    def forward(self, x, w):
        with tng.scope.npu_stream_switch("1"):
            s = x @ w
        x.add_(1)
        return s


def test_users_own_inplace_on_a_tensor_read_by_another_stream_is_a_race(npugraph):
    with npugraph.expect("race"):
        run(OwnInplace())


class ViewRead(torch.nn.Module):
    """``a`` is read on stream '1' through a view ``v``, then updated out of place on main.  With the
    view made on main, ReinplaceStreamChecker sees ``a``'s direct users (the slice and the add) on one
    stream, applies the pass, and the in-place ``add_`` races with the read on stream '1'."""

    def __init__(self, view_on_side=False, back=False):
        super().__init__()
        self.view_on_side, self.back = view_on_side, back
        self.ready = tng.ops.npu_create_tagged_event(tag="vr_ready")
        self.done = tng.ops.npu_create_tagged_event(tag="vr_done")

    def forward(self, x, w):
        a = x * 2
        tng.ops.npu_tagged_event_record(self.ready)
        if not self.view_on_side:
            v = a[0:2]                                         # the view is made on main
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.ready)
            if self.view_on_side:
                v = a[0:2]
            s = v @ w                                          # reads a on stream '1'
            tng.ops.npu_tagged_event_record(self.done)
        if self.back:
            tng.ops.npu_tagged_event_wait(self.done)
        b = a.add(1)                                           # reinplace candidate
        return s, b


def view_read_line(offset):
    return f"tests/replay/test_reinplace.py:{ViewRead.forward.__code__.co_firstlineno + offset}"


def check_values(s, b):
    assert s.cpu().tolist() == [[8.0] * 4] * 2 and b.cpu().tolist() == [[3.0] * 4] * 4


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_applied_reinplace_racing_with_a_view_read_on_another_stream_is_an_error(npugraph, mode):
    with npugraph.expect("reinplace-conflict", match=r"turned aten::add\.Tensor .* into aten::add_\.Tensor"):
        step = compile_with(ViewRead(), config(mode))
        for _ in range(2):                                     # capture, then replay
            check_values(*step(*inputs()))
    assert verdicts(npugraph) == ["applied"]
    assert "aten::add_.Tensor" in ops_run(npugraph)                # the pass really updates in place
    found = analyze(npugraph.trace, kinds=["race", "reinplace-conflict"])
    assert [h.kind for h in found] == ["reinplace-conflict"]    # not also reported as a plain race
    (h,) = found
    assert h.severity == "error"
    assert h.where == [view_read_line(13), view_read_line(9)]   # the update, the read through the view
    assert "slice_1 on stream 'main', add on stream 'main'" in h.message
    assert "disable_reinplace_inplaceable_ops_pass" in h.message


def test_reinplace_after_an_event_back_from_the_reading_stream_is_silent(npugraph):
    check_values(*run(ViewRead(back=True)))
    assert verdicts(npugraph) == ["applied"] and "aten::add_.Tensor" in ops_run(npugraph)
    npugraph.assert_clean()


def test_view_made_on_the_reading_stream_vetoes_the_reinplace_instead(npugraph):
    with npugraph.expect("reinplace-conflict", match="pay a copy"):
        check_values(*run(ViewRead(view_on_side=True)))
    assert verdicts(npugraph) == ["vetoed"] and "aten::add_.Tensor" not in ops_run(npugraph)
    assert [h.severity for h in hazards(npugraph)] == ["warning"]


def test_disabled_pass_keeps_the_functional_op_and_no_race(npugraph):
    check_values(*run(ViewRead(), disable_reinplace_inplaceable_ops_pass=True))
    assert verdicts(npugraph) == ["disabled"] and "aten::add_.Tensor" not in ops_run(npugraph)
    npugraph.assert_clean()


class GeViewRead(torch.nn.Module):
    """ViewRead without tagged events (GE mode rejects them; its converter orders data edges)."""

    def __init__(self, view_on_side=False):
        super().__init__()
        self.view_on_side = view_on_side

    def forward(self, x, w):
        a = x * 2
        v = None if self.view_on_side else a[0:2]
        with tng.scope.npu_stream_switch("1"):
            s = (a[0:2] if v is None else v) @ w
        b = a.add(1)
        return s, b


@pytest.mark.parametrize("view_on_side", [False, True])
def test_ge_mode_has_no_reinplace_passes_and_stays_silent(npugraph, view_on_side):
    """GE mode (max-autotune) never runs TorchAir's FX reinplace passes, and its converter puts an
    event pair on every cross-stream data edge: the same update next to a side-stream read is clean."""
    check_values(*run(GeViewRead(view_on_side), mode="max-autotune"))
    assert verdicts(npugraph) == []
    npugraph.assert_clean()


# ------------------------------------------------------------- what the passes themselves do
def graph_targets(npugraph):
    (record,) = npugraph.graphs
    return [str(n.target) for n in record.fx_graph.graph.nodes if n.op == "call_function"]


def test_input_mutated_pass_folds_the_copy_epilogue(npugraph):
    def f(x):
        x.add_(1)
        return x * 2

    x = torch.ones(4, device="npu")
    out = compile_with(f, config("reduce-overhead"))(x)
    assert x.cpu().tolist() == [2.0] * 4 and out.cpu().tolist() == [4.0] * 4
    targets = graph_targets(npugraph)
    assert "aten.add_.Tensor" in targets and "aten.copy_.default" not in targets
    assert [(v.verdict.verdict, v.verdict.pass_name) for v in npugraph.trace.records
            if isinstance(v, T.Reinplace)] == [("applied", "input-mutated")]
    npugraph.assert_clean()


def test_input_mutated_pass_switched_off_keeps_the_copy(npugraph):
    def f(x):
        x.add_(1)
        return x * 2

    x = torch.ones(4, device="npu")
    compile_with(f, config("reduce-overhead", disable_reinplace_input_mutated_ops_pass=True))(x)
    assert x.cpu().tolist() == [2.0] * 4
    targets = graph_targets(npugraph)
    assert "aten.add.Tensor" in targets and "aten.copy_.default" in targets
    assert verdicts(npugraph) == ["disabled"]


def test_no_reinplace_when_a_view_is_read_later_or_self_is_a_graph_input(npugraph):
    def f(x):
        a = x * 2
        v = a[0]
        b = a.add(1)               # a is still read through v afterwards: torch's step 2 refuses
        c = x.add(1)               # x is a graph input without a copy_ epilogue: step 1b refuses
        return b, v * 3, c

    b, v, c = compile_with(f, config("reduce-overhead"))(torch.ones(2, 2, device="npu"))
    assert b.cpu().tolist() == [[3.0] * 2] * 2 and v.cpu().tolist() == [6.0] * 2 and c.cpu().tolist() == [[2.0] * 2] * 2
    assert "add_" not in " ".join(graph_targets(npugraph))
    assert verdicts(npugraph) == ["applied"]       # only ``v * 3`` (mul -> mul_ on the dead view's value)


class OwnInplaceThroughView(torch.nn.Module):
    """The user's own ``x.add_`` on a graph input that stream '1' reads through a view taken on main:
    the input-mutated pass applies (the view hides the other stream), but the write is the user's."""

    def __init__(self):
        super().__init__()
        self.ready = tng.ops.npu_create_tagged_event(tag="oitv_ready")

    def forward(self, x, w):
        v = x[0:2]
        tng.ops.npu_tagged_event_record(self.ready)
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.ready)
            s = v @ w
        x.add_(1)
        return s


def test_users_own_inplace_folded_by_the_input_mutated_pass_stays_a_race(npugraph):
    with npugraph.expect("race", match=r"aten::add_\.Tensor"):
        run(OwnInplaceThroughView())
    assert [(v.verdict.verdict, v.verdict.pass_name) for v in npugraph.trace.records
            if isinstance(v, T.Reinplace)] == [("applied", "input-mutated")]
    assert hazards(npugraph) == []


# ------------------------------------------------- multi-inplace NPU ops (npu_add_rms_norm_v2)
def add_rms_norm_v2_expected(x1, x2, gamma, eps=1e-6):
    x = x1 + x2
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * gamma, x


def norm_inputs():
    g = torch.Generator().manual_seed(5)
    return [torch.randn(*shape, generator=g) for shape in ((4, 8), (4, 8), (8,))]


def test_multi_inplace_op_on_graph_inputs_is_reinplaced_by_the_input_mutated_pass(npugraph):
    def f(x1, x2, gamma):
        return torch_npu.npu_add_rms_norm_v2(x1, x2, gamma)

    cpu = norm_inputs()
    x1, x2, gamma = (t.npu() for t in cpu)
    rstd = compile_with(f, config("reduce-overhead"))(x1, x2, gamma)
    y, x = add_rms_norm_v2_expected(*cpu)
    torch.testing.assert_close(rstd.cpu(), torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(x1.cpu(), y)
    torch.testing.assert_close(x2.cpu(), x)
    targets = graph_targets(npugraph)
    assert "npu.npu_add_rms_norm_v2.default" in targets and "aten.copy_.default" not in targets
    assert [(v.verdict.verdict, v.verdict.pass_name, v.verdict.inplace_op) for v in npugraph.trace.records
            if isinstance(v, T.Reinplace)] == [("applied", "input-mutated", "npu::npu_add_rms_norm_v2")]
    npugraph.assert_clean()


class ResidualNorm(torch.nn.Module):
    """``h`` (an intermediate) is read on stream '1' and then normalised in place on main by
    ``npu_add_rms_norm_v2``: its users sit on two stream labels, so the reinplace is vetoed and the
    functional op (with copies of both mutated inputs) stays."""

    def __init__(self, side_read=True):
        super().__init__()
        self.side_read = side_read
        self.ready = tng.ops.npu_create_tagged_event(tag="rn_ready")
        self.done = tng.ops.npu_create_tagged_event(tag="rn_done")

    def forward(self, x, residual, gamma, w):
        h = x * 1.0
        tng.ops.npu_tagged_event_record(self.ready)
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.ready)
            s = (h @ w) if self.side_read else w * 2.0
            tng.ops.npu_tagged_event_record(self.done)
        tng.ops.npu_tagged_event_wait(self.done)
        r = residual * 1.0
        torch_npu.npu_add_rms_norm_v2(h, r, gamma)
        return s, h, r


@pytest.mark.parametrize("side_read", [True, False])
def test_multi_inplace_op_on_intermediates_checks_every_mutated_input(npugraph, side_read):
    x, residual, gamma = norm_inputs()
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(6))
    model = compile_with(ResidualNorm(side_read), config("reduce-overhead"))
    if side_read:
        with npugraph.expect("reinplace-conflict", match=r"node npu_add_rms_norm_v2_functional .*pay a copy"):
            s, h, r = model(x.npu(), residual.npu(), gamma.npu(), w.npu())
    else:
        s, h, r = model(x.npu(), residual.npu(), gamma.npu(), w.npu())
        npugraph.assert_clean()
    y, added = add_rms_norm_v2_expected(x, residual, gamma)
    torch.testing.assert_close(h.cpu(), y)
    torch.testing.assert_close(r.cpu(), added)
    if side_read:
        torch.testing.assert_close(s.cpu(), x @ w)
    assert verdicts(npugraph) == (["vetoed"] if side_read else ["applied"])
    assert ("npu::npu_add_rms_norm_v2" in ops_run(npugraph)) is not side_read


# ------------------------------------- custom ops with mutable arguments (auto_functionalized_v2)
@torch.library.custom_op("npugraph_tests::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@scale_.register_fake
def _(x, s):
    return None


def clones(npugraph):
    return [k for k in npugraph.trace.records if isinstance(k, T.Kernel) and k.graph and k.op == "aten::clone"]


@pytest.mark.parametrize("disabled", [False, True], ids=["pass-on", "pass-off"])
def test_mutable_custom_op_bases_are_updated_in_place_unless_the_pass_is_off(npugraph, disabled):
    def f(x, y):
        a = x + 1
        scale_(a, 2.0)             # an intermediate base
        scale_(y, 3.0)             # a graph input with its copy_ epilogue
        return a

    y = torch.ones(4, device="npu")
    out = compile_with(f, config("reduce-overhead", disable_reinplace_input_mutated_ops_pass=disabled))(
        torch.ones(4, device="npu"), y)
    assert out.cpu().tolist() == [4.0] * 4 and y.cpu().tolist() == [3.0] * 4
    targets = graph_targets(npugraph)
    assert ("npugraph_tests.scale_.default" in targets) is not disabled   # decomposed, or the HOP stays
    assert verdicts(npugraph) == (["disabled"] * 2 if disabled else ["applied"] * 2)
    assert bool(clones(npugraph)) is disabled                               # the dense HOP clones both bases
    npugraph.assert_clean()


class SideScale(torch.nn.Module):
    """A mutable custom op on main updates ``a``, which stream '1' also reads: the base is cloned."""

    def __init__(self):
        super().__init__()
        self.ready = tng.ops.npu_create_tagged_event(tag="ss_ready")
        self.done = tng.ops.npu_create_tagged_event(tag="ss_done")

    def forward(self, x, w):
        a = x * 2
        tng.ops.npu_tagged_event_record(self.ready)
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.ready)
            s = a @ w
            tng.ops.npu_tagged_event_record(self.done)
        tng.ops.npu_tagged_event_wait(self.done)
        scale_(a, 3.0)
        return s, a


def test_mutable_custom_op_base_used_on_another_stream_is_cloned(npugraph):
    with npugraph.expect("reinplace-conflict", match=r"auto_functionalized_v2\[a\]|auto_functionalized_v2\[mul\]"):
        s, a = run(SideScale())
    assert s.cpu().tolist() == [[8.0] * 4] * 4 and a.cpu().tolist() == [[6.0] * 4] * 4
    assert verdicts(npugraph) == ["vetoed"] and clones(npugraph)


@pytest.mark.parametrize("protected", [True, False])
def test_npugraph_ex_logs_each_reinplace_stream_check_as_npugraph_ex(npugraph, protected):
    """The npugraph_ex backend logs its stream check of a reinplace candidate on the ``npugraph_ex``
    logger, "success" when the users on other streams are ordered by events, "failed" otherwise, with
    npugraph_ex's wording (its smoke stream tests read these lines)."""
    import logging

    def f(x):
        a = x * 2
        stream, event = torch.npu.Stream(), torch.npu.Event()
        stream.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(stream):
            s = a * 3                      # reads a on the side stream
            event.record()
        if protected:
            event.wait()
        b = a.add(1)                       # a reinplace candidate: add -> add_ on a
        return s, b

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []

        def emit(self, record):
            if "check stream safety" in record.getMessage():
                self.lines.append(record.getMessage())

    compiled = torch.compile(f, backend="npugraph_ex", fullgraph=True, dynamic=False)
    from npugraph_ex.core.utils import logger as log          # npugraph_ex's logger, as its users raise it

    seen = Lines()
    level = log.level
    log.addHandler(seen)
    log.setLevel(logging.DEBUG)
    try:
        s, b = compiled(torch.ones(3, device="npu"))
    finally:
        log.removeHandler(seen)
        log.setLevel(level)
    torch.npu.synchronize()
    assert s.cpu().tolist() == [6.0] * 3 and b.cpu().tolist() == [3.0] * 3
    lines = seen.lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("[multi_stream_single_reinplace]Current node: add")
    if protected:
        assert ("check stream safety success for reinplace. Between the potential inplace node and user nodes, there "
                "is either no cross-stream dependency, or any cross-stream dependency is protected by events.") in lines[0]
    else:
        assert ("check stream safety failed for reinplace. Between the potential inplace node and user nodes, a "
                "cross-stream dependency exists without event protection.") in lines[0]
