"""An ExternalEvent's wait may precede its record (it holds the stream until the record happens): a
wait whose record never comes hangs the device, and the host at its next synchronize."""
import torch
import torch_npu  # noqa: F401

from pytest_npugraph.analysis import analyze

from analysis.tracebuild import Build


def kinds(trace):
    return sorted((h.kind, h.message.split(":")[0]) for h in analyze(trace) if h.kind in ("event-misuse", "deadlock"))


def test_wait_on_an_external_event_never_recorded_then_synchronize_is_a_hang():
    b = Build("main", "side")
    b.event("ext", external=True)
    b.wait("ext", "side")
    b.sync("device")
    (hazard,) = [h for h in analyze(b.trace) if h.kind == "event-misuse"]
    assert "never recorded" in hazard.message and "synchronize at model.py:2 waits for it forever" in hazard.message


def test_wait_before_a_later_record_is_fine():
    b = Build("main", "side")
    b.event("ext", external=True)
    b.wait("ext", "side")
    b.record("ext", "main")
    b.sync("device")
    assert kinds(b.trace) == []


def test_record_issued_only_after_the_synchronize_deadlocks_the_host():
    b = Build("main", "side")
    b.event("ext", external=True)
    b.wait("ext", "side")
    b.sync("device")
    b.record("ext", "main")
    assert kinds(b.trace) == [("deadlock", "deadlock")]


def test_two_external_events_recorded_after_each_others_wait_deadlock():
    b = Build("a", "b")
    b.event("e1", external=True)
    b.event("e2", external=True)
    b.wait("e1", "a")
    b.record("e2", "a")
    b.wait("e2", "b")
    b.record("e1", "b")
    b.sync("device")
    assert kinds(b.trace) and all(kind == "deadlock" for kind, _ in kinds(b.trace))


def test_two_ranks_external_events_deadlock_reads_the_same_whatever_the_issue_order():
    """Two ranks' threads: stream ids and the interleaving of their records change per run, the
    report must not (its cycle starts on npu:0, its streams are in device order)."""
    reports = set()
    for first, order in ((0, (0, 1, 2, 3)), (1, (1, 0, 3, 2)), (1, (0, 1, 3, 2))):
        b = Build(devices=2)
        streams = {device: b.stream("x", device) for device in (first, 1 - first)}
        events = [b.event(name, external=True) for name in ("e0", "e1")]
        calls = [lambda: b.wait(events[0], streams[0], line=10), lambda: b.wait(events[1], streams[1], line=10),
                 lambda: b.record(events[1], streams[0], line=11), lambda: b.record(events[0], streams[1], line=11)]
        for i in order:
            calls[i]()
        (hazard,) = [h for h in analyze(b.trace) if h.kind == "deadlock"]
        reports.add((hazard.message, tuple(hazard.where), tuple(hazard.streams)))
    (report,) = reports
    assert "never end, each waiting for the next: npu:0/x waits" in report[0] and report[2] == ("npu:0/x", "npu:1/x")


def test_two_external_events_in_the_right_order_are_fine():
    b = Build("a", "b")
    b.event("e1", external=True)
    b.event("e2", external=True)
    b.wait("e1", "a")
    b.record("e2", "a")
    b.record("e1", "b")
    b.wait("e2", "b")
    b.sync("device")
    assert kinds(b.trace) == []


def test_eager_external_event_never_recorded(npugraph):
    ev = torch.npu.ExternalEvent()
    side = torch.npu.Stream()
    ev.wait(side)
    with torch.npu.stream(side):
        torch.ones(4, device="npu").add_(1)
    with npugraph.expect("event-misuse", match=r"ExternalEvent that is never recorded.*synchronize"):
        torch.npu.synchronize()


def test_eager_external_event_recorded_after_its_wait(npugraph):
    ev = torch.npu.ExternalEvent()
    side = torch.npu.Stream()
    ev.wait(side)
    ev.record(torch.npu.current_stream())
    torch.npu.synchronize()
    assert [h for h in npugraph.hazards if h.kind in ("event-misuse", "deadlock")] == []


def test_eager_wait_before_record_orders_the_streams_and_the_values(npugraph):
    """The wait holds the side stream until the record: its read of x sees main's add (2, as
    hardware gives) and is no race."""
    ev = torch.npu.ExternalEvent()
    side = torch.npu.Stream()
    x = torch.zeros(4, device="npu")
    side.wait_stream(torch.npu.current_stream())
    ev.wait(side)
    with torch.npu.stream(side):
        y = x + 0
    x.add_(2)
    ev.record(torch.npu.current_stream())
    torch.npu.synchronize()
    assert y.cpu().tolist() == [2.0] * 4
    npugraph.assert_clean()


def test_eager_without_the_external_event_the_same_code_races(npugraph):
    side = torch.npu.Stream()
    x = torch.zeros(4, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        y = x + 0
    with npugraph.expect("race"):
        x.add_(2)
        torch.npu.synchronize()
    assert y.cpu().tolist() == [0.0] * 4
