"""reinplace-conflict: TorchAir's reinplace passes vetoed by multi-stream users (CONTRACT §5, issue 6;
torchair_api.md §4.1 steps 7-8, §4.9, §7.12).  A functional op whose mutated tensor has users on
more than one stream label keeps its copy (warning); silent on one stream, with the pass switched
off, and in npugraph_ex when the cross-stream user is ordered by tagged events.  The user's own
in-place op on a tensor another stream reads is a race."""
import torch
import torch_npu
import torchair as tng

from graph.helpers import compile_with, config

from pytest_npugraph.analysis import analyze


def hazards(npugraph):
    return analyze(npugraph.trace, kinds=["reinplace-conflict"])


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
    verdicts = [r.detail[3] for r in npugraph.trace.records if getattr(r, "what", None) == "reinplace"]
    assert verdicts == ["applied"]
    npugraph.assert_clean()


def test_pass_disabled_by_config_is_silent(npugraph):
    run(SideRead(back=True), disable_reinplace_inplaceable_ops_pass=True)
    assert hazards(npugraph) == []
    npugraph.assert_clean()


def test_event_protected_user_is_reinplaced_in_npugraph_ex(npugraph):
    run(SideRead(back=True), mode="npugraph_ex")
    assert hazards(npugraph) == []
    verdicts = [r.detail[3] for r in npugraph.trace.records if getattr(r, "what", None) == "reinplace"]
    assert verdicts == ["protected"]
    npugraph.assert_clean()


def test_unprotected_user_is_still_vetoed_in_npugraph_ex(npugraph):
    with npugraph.expect("reinplace-conflict"):
        run(SideRead(back=False), mode="npugraph_ex")


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
