"""Kind ``event-misuse``: each sub-rule of analysis/events.py catches and stays silent."""
from __future__ import annotations

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import events

from .tracebuild import Build


def found(b: Build) -> list:
    return events.find(b.trace)


# ---------------------------------------------------------------- (a) never recorded
def test_wait_on_never_recorded_event():
    b = Build("s0", "s1")
    w = b.wait("e", "s1")
    b.record("e", "s0")
    [h] = found(b)
    assert h.seqs == (w,) and h.streams == ["npu:0/s1"]
    assert "never recorded" in h.message and "Event#500 (created at model.py:1)" in h.message
    assert h.severity == "warning"          # a no-op on hardware (NPUEvent::block): the race detector
                                            # reports what it fails to order


def test_wait_after_record_is_silent():
    b = Build("s0", "s1")
    b.record("e", "s0")
    b.wait("e", "s1")
    assert found(b) == []


def test_host_synchronize_on_never_recorded_event():
    b = Build("s0")
    b.sync("event", event="e")
    [h] = found(b)
    assert "the host synchronizes" in h.message and h.severity == "warning"


def test_external_event_may_be_waited_before_its_record():
    b = Build("s0", "s1")
    b.event("ext", external=True)
    b.wait("ext", "s1")
    b.record("ext", "s0")
    assert found(b) == []


def test_repeated_wait_at_one_line_is_one_report():
    b = Build("s0", "s1")
    for _ in range(5):
        b.wait("e", "s1", line=7)
    assert len(found(b)) == 1


# ---------------------------------------------------------------- (b) capture joins
def capture(join: bool, fork: bool = True) -> Build:
    b = Build("capture", "side")
    b.marker(T.CaptureBegin, "capture")
    b.kernel("capture")
    if fork:
        b.wait_stream("side", "capture")
    b.kernel("side", op="side_op", line=40)
    if join:
        b.wait_stream("capture", "side")
    b.kernel("capture")
    b.marker(T.CaptureEnd, "capture", line=50)
    return b


def test_side_stream_not_joined_before_capture_end():
    [h] = found(capture(join=False))
    assert h.streams == ["npu:0/side", "npu:0/capture"] and h.where == ["model.py:40", "model.py:50"]
    assert "did not wait for it before the capture ended" in h.message
    assert "`torch.npu.current_stream().wait_stream(<the stream object of npu:0/side>)` on the capture stream" in h.message


def test_joined_side_stream_is_silent():
    assert found(capture(join=True)) == []


def test_unforked_unjoined_side_work_is_reported():
    assert len(found(capture(join=False, fork=False))) == 1


def test_capture_without_side_streams_is_silent():
    b = Build("capture", "side")
    b.kernel("side")
    b.marker(T.CaptureBegin, "capture")
    b.kernel("capture")
    b.marker(T.CaptureEnd, "capture")
    b.kernel("side")
    assert found(b) == []


def test_other_device_work_during_capture_is_not_part_of_it():
    b = Build("capture")
    b.stream("far", device=1)
    b.marker(T.CaptureBegin, "capture")
    b.kernel("far")
    b.kernel("capture")
    b.marker(T.CaptureEnd, "capture")
    assert found(b) == []


def test_side_work_joined_through_an_event_chain_is_silent():
    b = Build("capture", "a", "b")
    b.marker(T.CaptureBegin, "capture")
    b.wait_stream("a", "capture")
    b.kernel("a")
    b.record("ea", "a")
    b.wait("ea", "b")
    b.kernel("b")
    b.record("eb", "b")
    b.wait("eb", "capture")
    b.marker(T.CaptureEnd, "capture")
    assert found(b) == []


# ---------------------------------------------------------------- (c) cross-device record
def test_event_recorded_on_another_device():
    b = Build("s0")
    b.stream("far", device=1)
    b.record("e", "s0")
    b.record("e", "far")
    [h] = found(b)
    assert "belongs to npu:0" in h.message and "npu:1" in h.message


def test_rerecord_on_the_same_device_is_silent():
    b = Build("s0", "s1")
    b.record("e", "s0")
    b.record("e", "s1")
    assert found(b) == []


# ---------------------------------------------------------------- (d) external waited twice
def test_external_event_waited_twice_for_one_record():
    b = Build("s0", "s1", "s2")
    b.event("ext", external=True)
    b.record("ext", "s0")
    b.wait("ext", "s1")
    second = b.wait("ext", "s2")
    [h] = found(b)
    assert h.seqs == (second,) and "ExternalEvent" in h.message


def test_external_event_rerecorded_between_waits_is_silent():
    b = Build("s0", "s1")
    b.event("ext", external=True)
    for _ in range(2):
        b.record("ext", "s0")
        b.wait("ext", "s1")
    assert found(b) == []


def test_ordinary_event_waited_twice_is_silent():
    b = Build("s0", "s1", "s2")
    b.record("e", "s0")
    b.wait("e", "s1")
    b.wait("e", "s2")
    assert found(b) == []


# ---------------------------------------------------------------- (e) tags
def test_reused_tag():
    b = Build("s0")
    b.event("a", tag="66")
    b.event("b", tag="66")
    b.event("c", tag="77")
    [h] = found(b)
    assert "tag '66'" in h.message


def test_external_event_reset_restarts_the_count():
    b = Build("s0", "s1", "s2")
    b.event("ext", external=True)
    b.record("ext", "s0")
    b.wait("ext", "s1")
    b.marker(T.EventReset, "s0", event=b.eids["ext"])
    b.wait("ext", "s2")   # belongs to the next record
    b.record("ext", "s0")
    assert found(b) == []
