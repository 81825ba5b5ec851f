"""Streams and events of the emulated torch.npu against torch_npu 2.14.0 (torch_npu_api.md §2)."""
import re

import pytest
import torch
import torch_npu

from pytest_npugraph import trace as T

POOL, HIGH, SYNC_LAUNCH, EXTERNAL = 3 << 5, 4 << 5, 2 << 5, 1 << 30
STREAM_REPR = r"<torch_npu\.npu\.Stream device=npu:{} npu_stream=0x[0-9a-f]+>"


def records(npugraph, kind, start=0):
    return [r for r in npugraph.trace.records[start:] if isinstance(r, kind)]


def sid(npugraph, stream):
    """The trace's id of a stream handle."""
    return next(i.sid for i in npugraph.trace.streams.values()
                if (i.device, i.stream_id) == (stream.device_index, stream.stream_id))


# ------------------------------------------------------------------ streams
def test_stream_is_a_torch_stream_on_the_npu(npugraph):
    s = torch.npu.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch_npu.npu.Stream)
    assert s.device == torch.device("npu", 0) and s.device_index == 0
    assert s.device_type == 20
    assert s.stream_id == POOL + 0


def test_pool_is_round_robin_over_32(npugraph):
    streams = [torch.npu.Stream() for _ in range(33)]
    assert [s.stream_id for s in streams[:32]] == [POOL + i for i in range(32)]
    assert streams[32] == streams[0] and streams[32] is not streams[0]
    assert len(set(streams)) == 32


@pytest.mark.parametrize("priority, base", [(0, POOL), (5, POOL), (100, POOL), (-1, HIGH), (-7, HIGH)])
def test_priority_is_clamped_to_two_pools(npugraph, priority, base):
    assert torch.npu.Stream(priority=priority).stream_id == base
    assert torch.npu.Stream(priority=priority).stream_id == base + 1


def test_pools_are_independent(npugraph):
    torch.npu.Stream(priority=-1)
    assert torch.npu.Stream().stream_id == POOL
    assert torch.npu.Stream(priority=-1).stream_id == HIGH + 1


@pytest.mark.npu_devices(2)
def test_stream_on_another_device(npugraph):
    s = torch.npu.Stream(device=1)
    assert s.device == torch.device("npu", 1) and s.stream_id == POOL
    assert torch.npu.current_device() == 0
    assert torch.npu.Stream("npu:1").stream_id == POOL + 1      # each device has its own pool
    assert torch.npu.Stream().stream_id == POOL


def test_stream_on_a_missing_device_fails(npugraph):
    with pytest.raises(RuntimeError, match=r"error code is \d+"):
        torch.npu.Stream(device=1)


def test_default_and_current_stream(npugraph):
    d = torch.npu.default_stream()
    c = torch.npu.current_stream()
    assert d.stream_id == 0 and c.stream_id == 0
    assert c == d and c is not torch.npu.current_stream()       # a new handle each call
    assert hash(c) == hash(d)
    assert torch.npu.current_stream(0) == torch.npu.current_stream("npu:0") == d


def test_set_stream_and_none(npugraph):
    s = torch.npu.Stream()
    torch.npu.set_stream(s)
    assert torch.npu.current_stream() == s
    torch.npu.set_stream(None)                                  # no-op
    assert torch.npu.current_stream() == s
    assert torch.npu.default_stream() != s
    torch.npu.set_stream(torch.npu.default_stream())
    assert torch.npu.current_stream().stream_id == 0


@pytest.mark.npu_devices(2)
def test_set_stream_switches_the_device(npugraph):
    s1 = torch.npu.Stream(device=1)
    torch.npu.set_stream(s1)
    assert torch.npu.current_device() == 1
    assert torch.npu.current_stream() == s1
    assert torch.npu.current_stream(0).stream_id == 0           # current streams are per device


def test_stream_context_restores(npugraph):
    s = torch.npu.Stream()
    with torch.npu.stream(s) as entered:
        assert entered is None
        assert torch.npu.current_stream() == s
        x = torch.ones(2, device="npu")
    assert torch.npu.current_stream().stream_id == 0
    kernels = records(npugraph, T.Kernel)
    assert kernels and kernels[-1].stream == sid(npugraph, s)
    torch.npu.current_stream().wait_stream(s)
    assert x.cpu().tolist() == [1.0, 1.0]
    with torch.npu.stream(None):                                # no-op
        assert torch.npu.current_stream().stream_id == 0
    assert isinstance(torch.npu.stream(s), torch.npu.StreamContext)


@pytest.mark.npu_devices(2)
def test_stream_context_on_another_device_restores_both(npugraph):
    s0, s1, t1 = torch.npu.Stream(device=0), torch.npu.Stream(device=1), torch.npu.Stream(device=1)
    torch.npu.set_stream(s0)
    with torch.npu.device(1):
        torch.npu.set_stream(t1)
    with torch.npu.stream(s1):
        assert torch.npu.current_device() == 1
        assert torch.npu.current_stream() == s1
    assert torch.npu.current_device() == 0
    assert torch.npu.current_stream() == s0
    assert torch.npu.current_stream(1) == t1


def test_stream_context_restores_on_error(npugraph):
    s = torch.npu.Stream()
    with pytest.raises(ValueError):
        with torch.npu.stream(s):
            raise ValueError
    assert torch.npu.current_stream().stream_id == 0


def test_stream_equality_and_hash(npugraph):
    a, b = torch.npu.Stream(), torch.npu.Stream()
    assert a != b and a == a
    same = torch_npu.npu.Stream(stream_id=a.stream_id, device_index=0, device_type=20)
    assert same == a and hash(same) == hash(a) == hash((a.npu_stream, a.device))
    assert {a: 1}[same] == 1
    assert (a == 1) is False and (a == "stream") is False
    assert (a == torch.Stream(stream_id=a.stream_id, device_index=0, device_type=20)) is False


def test_stream_repr(npugraph):
    s = torch.npu.Stream()
    assert re.fullmatch(STREAM_REPR.format(0), repr(s))
    assert repr(s) == f"<torch_npu.npu.Stream device=npu:0 npu_stream={s.npu_stream:#x}>"
    assert s._as_parameter_.value == s.npu_stream
    assert s.npu_stream != torch.npu.default_stream().npu_stream


def test_priority_is_not_supported(npugraph):
    with pytest.raises(RuntimeError) as info:
        torch.npu.Stream().priority
    assert str(info.value).startswith("NPU dose not support Stream.get_priority() currently.")
    with pytest.raises(RuntimeError, match=r"^NPU does not support Stream\.priority_range\(\) currently\."):
        torch.npu.Stream.priority_range()


def test_forged_stream_id_is_rejected(npugraph):
    with pytest.raises(RuntimeError, match="Did you manufacture the StreamId yourself"):
        torch_npu.npu.Stream(stream_id=(7 << 5) + 3, device_index=0, device_type=20)


def test_wait_stream_records_then_waits(npugraph):
    s = torch.npu.Stream()
    x = torch.ones(4, device="npu")
    start = len(npugraph.trace.records)
    assert s.wait_stream(torch.npu.current_stream()) is None
    rec, wait = npugraph.trace.records[start:start + 2]
    assert isinstance(rec, T.EventRecord) and rec.stream == sid(npugraph, torch.npu.default_stream())
    assert isinstance(wait, T.EventWait) and wait.stream == sid(npugraph, s) and wait.event == rec.event
    with torch.npu.stream(s):
        y = x * 2
    torch.npu.current_stream().wait_stream(s)
    assert (y + 1).cpu().tolist() == [3.0] * 4
    npugraph.assert_clean()


def test_record_event_and_wait_event(npugraph):
    s = torch.npu.Stream()
    e = s.record_event()
    assert isinstance(e, torch.npu.Event)
    mine = torch.npu.Event()
    assert s.record_event(mine) is mine
    assert torch.npu.current_stream().wait_event(e) is None
    recs, waits = records(npugraph, T.EventRecord), records(npugraph, T.EventWait)
    assert [r.stream for r in recs] == [sid(npugraph, s)] * 2
    assert waits[-1].event == recs[0].event and waits[-1].stream == sid(npugraph, torch.npu.default_stream())


def test_query_and_synchronize(npugraph):
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.ones(2, device="npu")
    assert s.query() is False                        # the first ask about new work: not known done yet
    assert s.query() is True
    sync = records(npugraph, T.HostSync)[-1]
    assert (sync.what, sync.stream) == ("stream", sid(npugraph, s))
    assert s.synchronize() is None
    sync = records(npugraph, T.HostSync)[-1]
    assert (sync.what, sync.stream) == ("stream", sid(npugraph, s))


# ------------------------------------------------------------ external / sync-launch
def test_external_stream(npugraph):
    ext = torch.npu.ExternalStream(0xDEAD0000)
    assert isinstance(ext, torch.npu.Stream)
    assert ext.npu_stream == 0xDEAD0000
    assert ext.stream_id & EXTERNAL
    assert torch.npu.ExternalStream(0xDEAD0000) == ext               # one stream per pointer
    assert torch.npu.ExternalStream(0xBEEF0000) != ext
    assert torch.npu.Stream() != ext
    torch.npu.set_stream_limit(ext, 4, 8)                            # an ExternalStream is a Stream
    assert torch.npu.get_stream_limit(ext) == {"cube_core_num": 4, "vector_core_num": 8}


@pytest.mark.parametrize("kwargs, message", [
    ({"priority": -1}, "Priority was explicitly set for an external stream"),
    ({"is_sync_launch": 1}, "is_sync_launch was explicitly set for an external stream"),
])
def test_external_stream_rejects_pool_options(npugraph, kwargs, message):
    with pytest.raises(RuntimeError) as info:
        torch.npu.ExternalStream(0x1000, **kwargs)
    assert str(info.value).startswith(message)


def _unsupported(api):
    return rf"^External NPU stream is not supported in {api}\. This path requires a torch_npu-managed stream\."


@pytest.mark.parametrize("use, pattern", [
    (lambda ext, e: ext.query(), r"^Cannot query external NPU stream status\. The caller must track stream "
                                 r"completion externally\."),
    (lambda ext, e: ext.synchronize(), r"^External NPU stream is not supported in NPUStream::synchronize\. The "
                                       r"caller is responsible for synchronization of external streams\."),
    (lambda ext, e: ext.record_event(), _unsupported("NPUEvent::record")),
    (lambda ext, e: e.record(ext), _unsupported("NPUEvent::record")),
    (lambda ext, e: ext.wait_event(e), _unsupported("NPUEvent::block")),
    (lambda ext, e: ext.wait_stream(torch.npu.current_stream()), _unsupported("NPUEvent::block")),
    (lambda ext, e: torch.ones(2, device="npu").record_stream(ext), _unsupported("record_stream")),
])
def test_external_stream_unsupported_calls(npugraph, use, pattern):
    ext = torch.npu.ExternalStream(0x5000)
    e = torch.npu.Event()
    e.record()
    with pytest.raises(RuntimeError, match=pattern):
        use(ext, e)


def test_sync_launch_stream(npugraph):
    streams = [torch.npu.SyncLaunchStream() for _ in range(5)]
    assert [s.stream_id for s in streams[:4]] == [SYNC_LAUNCH + i for i in range(4)]
    assert streams[4] == streams[0]                                 # a pool of 4
    assert torch.npu.SyncLaunchStream(priority=-1).stream_id == SYNC_LAUNCH + 1   # priority ignored
    s = streams[0]
    assert not isinstance(s, torch.npu.Stream) and isinstance(s, torch.Stream)
    assert (s == torch_npu.npu.Stream(stream_id=s.stream_id, device_index=0, device_type=20)) is False
    assert re.fullmatch(r"<torch_npu\.npu\.SyncLaunchStream device=npu:0 npu_stream=0x[0-9a-f]+>", repr(s))
    e = s.record_event()
    torch.npu.current_stream().wait_event(e)
    assert s.query() is False and s.query() is True and s.synchronize() is None


# ----------------------------------------------------------------------- events
def test_event_is_lazy(npugraph):
    e = torch.npu.Event()
    assert e.device is None and e.npu_event == 0
    assert repr(e) == "<torch_npu.npu.Event uninitialized>"
    e.record()
    assert e.device == torch.device("npu", 0)
    assert re.fullmatch(r"<torch_npu\.npu\.Event 0x[0-9a-f]+>", repr(e))
    assert repr(e) == f"<torch_npu.npu.Event {e.npu_event:#x}>"


def test_event_arguments(npugraph):
    assert torch.npu.Event(enable_timing=True, blocking=True).query() is True
    assert torch.npu.Event(interprocess=True).query() is True
    with pytest.raises(RuntimeError, match="^Parameter interprocess cannot be specified together with other "
                                           "parameters."):
        torch.npu.Event(enable_timing=True, interprocess=True)


@pytest.mark.npu_devices(2)
def test_event_device_is_fixed_by_the_first_record(npugraph):
    e = torch.npu.Event()
    e.record(torch.npu.Stream(device=1))
    assert e.device == torch.device("npu", 1)
    with pytest.raises(RuntimeError) as info:
        e.record(torch.npu.current_stream(0))
    assert str(info.value).startswith("Event device 1 does not match recording stream's device 0.")
    e.wait(torch.npu.current_stream(0))                             # any device may wait


def test_event_record_defaults_to_the_current_stream(npugraph):
    s = torch.npu.Stream()
    e = torch.npu.Event()
    with torch.npu.stream(s):
        e.record()
        e.wait()
    rec, wait = records(npugraph, T.EventRecord)[-1], records(npugraph, T.EventWait)[-1]
    assert rec.stream == wait.stream == sid(npugraph, s)


def test_wait_on_never_recorded_event_is_a_no_op(npugraph):
    e = torch.npu.Event()
    with npugraph.expect("event-misuse"):            # no error, but the checker notices
        e.wait()
        torch.npu.Stream().wait_event(e)
    assert e.query() is True
    assert e.synchronize() is None


def test_event_labels_number_the_events_this_thread_made_in_this_test(npugraph):
    """Not a process-wide id: the label must not depend on earlier tests or, under run_ranks, on
    which rank's thread made its event first."""
    torch.randn(4).npu(), torch.npu.Stream()                  # blocks and streams take no number
    first, second = torch.npu.Event(), torch.npu.Event()
    with npugraph.expect("event-misuse", match=r"Event#2\b"):
        torch.npu.current_stream().wait_event(second)
    assert [info.label for info in npugraph.trace.events.values()][-2:] == ["Event#1", "Event#2"]
    assert first.query()


def test_event_query_synchronize_and_timing(npugraph):
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    assert start.query() is True                                  # never recorded
    start.record()
    torch.ones(8, device="npu").sum()
    end.record()
    assert end.query() is False and end.query() is True      # a first ask about new work answers False
    assert end.synchronize() is None
    assert records(npugraph, T.HostSync)[-1].what == "event"
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms >= 0.0
    assert isinstance(start.recorded_time(), int)


def test_elapsed_time_needs_both_records(npugraph):
    a, b = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    a.record()
    with pytest.raises(RuntimeError, match=r"^Both events must be recorded before calculating elapsed time\."):
        a.elapsed_time(b)
    with pytest.raises(RuntimeError, match=r"^Both events must be recorded before calculating elapsed time\."):
        b.elapsed_time(a)
    with pytest.raises(RuntimeError, match=r"^Event must be recorded before getting recorded timestamp\."):
        b.recorded_time()


def test_plain_event_cannot_reset(npugraph):
    with pytest.raises(RuntimeError, match=r"^API reset\(\) only support ACL_EVENT_EXTERNAL flag event\."):
        torch.npu.Event().reset()


def test_external_event(npugraph):
    e = torch.npu.ExternalEvent()
    assert repr(e) == "<torch_npu.npu.ExternalEvent uninitialized>"
    s = torch.npu.Stream()
    e.wait(s)                                        # a wait may precede the record: no hazard
    assert re.fullmatch(r"<torch_npu\.npu\.ExternalEvent 0x[0-9a-f]+>", repr(e))
    e.record()
    e.reset()
    e.record(s)
    resets = records(npugraph, T.EventReset)
    assert len(resets) == 1 and resets[0].stream == sid(npugraph, torch.npu.default_stream())
    assert [r.stream for r in records(npugraph, T.EventRecord)] == [sid(npugraph, torch.npu.default_stream()),
                                                                     sid(npugraph, s)]
    npugraph.assert_clean()
    with pytest.raises(TypeError):
        torch.npu.ExternalEvent(True)


def test_record_stream_is_recorded(npugraph):
    s = torch.npu.Stream()
    x = torch.ones(4, device="npu")
    assert x.record_stream(s) is None
    rs = records(npugraph, T.RecordStream)
    assert len(rs) == 1 and rs[0].stream == sid(npugraph, s)


def test_erase_stream_checks_its_arguments(npugraph):
    with pytest.raises(TypeError, match="^tensor should be torch.Tensor, could not be <class 'int'>"):
        torch_npu.erase_stream(1, torch.npu.Stream())
    with pytest.raises(TypeError, match="^stream should be torch_npu.npu.Stream, could not be <class 'str'>"):
        torch_npu.erase_stream(torch.ones(1, device="npu"), "s")
