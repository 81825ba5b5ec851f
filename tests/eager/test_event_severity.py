"""Severity by consequence (issue 24, item 8): a wait on (or host synchronize of) a plain
``torch.npu.Event`` that was never recorded is a no-op on hardware (``NPUEvent::block`` returns when
the event was never created): a warning, and the race detector reports what it fails to order.  An
``ExternalEvent`` never recorded holds its stream forever: an error, as before."""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph.analysis import analyze


def misuse(npugraph):
    return [h for h in analyze(npugraph.trace) if h.kind == "event-misuse"]


def test_a_wait_on_a_never_recorded_event_is_a_warning_and_fails_nothing(npugraph):
    e = torch.npu.Event()
    torch.npu.Stream().wait_event(e)
    (found,) = misuse(npugraph)
    assert found.severity == "warning" and "never recorded" in found.message
    npugraph.assert_clean()                          # a warning does not fail the test
    with pytest.raises(AssertionError, match="never recorded"):
        npugraph.assert_clean("event-misuse")        # named, the kind's warnings count


def test_what_the_no_op_wait_fails_to_order_is_reported_as_a_race(npugraph):
    a = torch.zeros(4, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    done = torch.npu.Event()
    with torch.npu.stream(side):
        a.fill_(1)                                   # the record of `done` after it is forgotten
    torch.npu.current_stream().wait_event(done)
    with npugraph.expect("race", match="aten::add_"):
        a.add_(1)
    assert [h.severity for h in misuse(npugraph)] == ["warning"]


def test_an_external_event_never_recorded_is_an_error(npugraph):
    ev = torch.npu.ExternalEvent()
    side = torch.npu.Stream()
    ev.wait(side)
    with torch.npu.stream(side):
        torch.ones(4, device="npu").add_(1)
    with npugraph.expect("event-misuse", match="ExternalEvent that is never recorded"):
        torch.npu.synchronize()
    assert [h.severity for h in misuse(npugraph)] == ["error"]


NEVER_RECORDED = """
import torch, torch_npu

def test_wait_on_never_recorded_event(npugraph):
    e = torch.npu.Event()
    torch.npu.current_stream().wait_event(e)
    torch.npu.synchronize()
"""


def test_the_test_of_a_never_recorded_wait_passes_with_a_warning(pytester):
    """As on hardware, where the wait returns at once."""
    pytester.makepyfile(test_wait=NEVER_RECORDED)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*NpuHazardWarning: [[]event-misuse[]]*never recorded*",
                                 "event-misuse * 0 * 0 * 0 * 1 * 0 *"])
