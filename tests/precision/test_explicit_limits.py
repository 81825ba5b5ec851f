"""The documented core rule counts the limits the user set, also one at the device maximum
(issue: set_stream_limit(main, 24, 48) plus a side stream at 12/24 on a 24-cube-core chip was
silent); TorchAir's restore to the maximum after a limit_core_num scope is no limit."""
import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from torchair import scope

from graph.helpers import reduce_overhead


def _overlap(main_limit, side_limit):
    main, side = torch.npu.current_stream(), torch.npu.Stream()
    if main_limit:
        torch.npu.set_stream_limit(main, *main_limit)
    torch.npu.set_stream_limit(side, *side_limit)
    x = torch.randn(32, 32, device="npu")
    side.wait_stream(main)
    with torch.npu.stream(side):
        shared = x @ x                       # runs while the main stream's matmul may
    routed = x @ x.T
    main.wait_stream(side)
    return routed + shared


def _core_limits(npugraph):
    return [h for h in npugraph.hazards if h.kind == "core-limit"]


@pytest.mark.npu_cores(aicore=24, vector=48)
def test_a_limit_at_the_maximum_counts_in_the_rule(npugraph):
    with npugraph.expect("core-limit", match=r"stream limit 24.*stream limit 12|stream limit 12.*stream limit 24"):
        _overlap((24, 48), (12, 24))


@pytest.mark.npu_cores(aicore=24, vector=48)
def test_limits_that_fit_together_are_silent(npugraph):
    _overlap((12, 24), (12, 24))
    assert _core_limits(npugraph) == []


@pytest.mark.npu_cores(aicore=24, vector=48)
def test_no_limit_on_main_is_silent(npugraph):
    _overlap(None, (12, 24))
    assert _core_limits(npugraph) == []


@pytest.mark.npu_cores(aicore=24, vector=48)
def test_torchair_restore_to_the_maximum_is_no_limit(npugraph):
    """Inside the graph the side stream's scope sets 12 cube cores and restores what it read (24, the
    maximum: nobody had set a limit) afterwards; the main stream's work is unlimited."""
    done = torchair.ops.npu_create_tagged_event(tag="restore_test")

    def f(x):
        with scope.npu_stream_switch("1"):
            with scope.limit_core_num(12, 24):
                a = x @ x
            b = x @ x.T                      # after the restore: no limit on the side stream
            torchair.ops.npu_tagged_event_record(done)
        c = x @ x                            # main: no limit either
        torchair.ops.npu_tagged_event_wait(done)
        return a + b + c

    x = torch.randn(32, 32, device="npu")
    out = reduce_overhead(f)(x)
    assert torch.allclose(out.cpu(), (x @ x + x @ x.T + x @ x).cpu(), atol=1e-4)
    assert _core_limits(npugraph) == []
    limits = {(k.cube_limit, k.op) for k in npugraph.trace.records if type(k).__name__ == "Kernel"}
    assert all(cube in (0, 12) for cube, _ in limits)      # the restore recorded no limit of 24
