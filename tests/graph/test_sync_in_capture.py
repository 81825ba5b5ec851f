"""A host synchronisation inside a graph capture raises, as on hardware.

A capture records device work without running it, so the host can never see it done: the ACL
runtime refuses to synchronise with a capturing stream (ACL_ERROR_RT_STREAM_CAPTURED, 107027) or
with an event recorded in the capture (ACL_ERROR_RT_EVENT_CAPTURED, 107028), and torch_npu raises
that through NPU_CHECK_ERROR.  Before the fix every such call just synchronised and the capture went on.
The same calls before ``capture_begin``, after ``capture_end`` and around replays are fine.
"""
import pytest
import torch
import torch_npu  # noqa: F401

STREAM_CAPTURED = r"NPU function error: aclrtSynchronizeStreamWithTimeout, error code is 107027"
DEVICE_CAPTURED = r"NPU function error: aclrtSynchronizeDeviceWithTimeout, error code is 107027"
EVENT_CAPTURED = r"NPU function error: aclrtSynchronizeEvent, error code is 107028"


def _syncs(x, y, side, event):
    """Each kind of host sync, by name: (call, pattern of the error inside a capture)."""
    return {
        "item": (lambda: y.sum().item(), STREAM_CAPTURED),
        "cpu": (lambda: y.cpu(), STREAM_CAPTURED),
        "tolist": (lambda: y.tolist(), STREAM_CAPTURED),
        "to_cpu": (lambda: y.to("cpu"), STREAM_CAPTURED),
        "copy_to_host": (lambda: torch.empty(4).copy_(y), STREAM_CAPTURED),
        "print": (lambda: repr(y), STREAM_CAPTURED),
        "nonzero": (lambda: torch.nonzero(y), STREAM_CAPTURED),
        "bool": (lambda: bool((y > 0).all()), STREAM_CAPTURED),
        "storage_read": (lambda: y.storage()[0], STREAM_CAPTURED),
        "device_synchronize": (torch.npu.synchronize, DEVICE_CAPTURED),
        "stream_synchronize": (side.synchronize, STREAM_CAPTURED),
        "stream_query": (side.query, STREAM_CAPTURED),
        "current_stream_synchronize": (lambda: torch.npu.current_stream().synchronize(), STREAM_CAPTURED),
        "event_synchronize": (event.synchronize, EVENT_CAPTURED),
    }


KINDS = ["item", "cpu", "tolist", "to_cpu", "copy_to_host", "print", "nonzero", "bool", "storage_read",
         "device_synchronize", "stream_synchronize", "stream_query", "current_stream_synchronize",
         "event_synchronize"]


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("kind", KINDS)
def test_a_host_sync_inside_a_capture_raises(npugraph, kind):
    x = torch.ones(4, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    g = torch.npu.NPUGraph()
    with torch.npu.stream(side):
        g.capture_begin()
        y = x + 1
        event = torch.npu.Event()
        event.record()
        call, pattern = _syncs(x, y, side, event)[kind]
        with pytest.raises(RuntimeError, match=pattern) as info:
            call()
        g.capture_end()
    message = str(info.value)
    assert "which is capturing NPUGraph@tests/graph/test_sync_in_capture.py:" in message and "forbids host synchronisation" in message
    assert "test_sync_in_capture.py" in message            # the user's line
    assert "ERR00100 PTA call acl api failed" in message
    assert ("event is captured" if kind == "event_synchronize" else "stream is captured") in message


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("kind", KINDS)
def test_the_same_syncs_outside_a_capture_are_fine(npugraph, kind):
    x = torch.ones(4, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        y = x + 1
        event = torch.npu.Event()
        event.record()
    g = torch.npu.NPUGraph()
    with torch.npu.stream(side):
        g.capture_begin()
        z = y * 2
        g.capture_end()
        _syncs(x, y, side, event)[kind][0]()                # after capture_end
        g.replay()
        _syncs(x, z, side, event)[kind][0]()                # after a replay
        assert z.cpu().tolist() == [4.0] * 4


def test_a_sync_on_another_stream_than_the_capturing_one_is_fine(npugraph):
    x = torch.ones(4, device="npu")
    other = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.stream(torch.npu.Stream()):
        g.capture_begin()
        y = x * 3
        other.synchronize()                                # no work of the capture on it
        g.capture_end()
    g.replay()
    assert y.cpu().tolist() == [3.0] * 4


def test_item_inside_torch_npu_graph_raises_to_the_user_and_ends_the_capture(npugraph):
    x = torch.ones(4, device="npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=STREAM_CAPTURED):
        with torch.npu.graph(g):
            y = x * 2
            if y.sum().item() > 0:                        # data-dependent control flow: not capturable
                y = y + 1
    assert not torch.npu.is_current_stream_capturing()
    assert torch.npu.current_stream() == torch.npu.default_stream()
    torch.npu.synchronize()                               # the device is usable again
    assert (x + 1).cpu().tolist() == [2.0] * 4


def test_a_capture_with_item_inside_fails_the_test_with_the_message(pytester):
    pytester.makepyfile(test_user="""
        import torch, torch_npu

        def test_capture(npugraph):
            x = torch.ones(4, device="npu")
            g = torch.npu.NPUGraph()
            with torch.npu.graph(g):
                scale = (x.max() + 1).item()
                y = x * scale
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*RuntimeError: NPU function error: aclrtSynchronizeStreamWithTimeout, error code is 107027*",
        "*stream is captured.*",
        "*a blocking device-to-host read (aten::_local_scalar_dense) at test_user.py:7 synchronizes the host with "
        "*which is capturing NPUGraph@test_user.py:6: a graph capture forbids host synchronisation*",
    ])
