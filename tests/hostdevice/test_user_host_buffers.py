"""Host/device races on the user's own CPU tensors: the source of a non_blocking host-to-device
copy written, or the destination of ``cpu_t.copy_(npu_t, non_blocking=True)`` used, before the host
knows the copy done (``race``, host_races.py).

Why: refilling a staging buffer that a non_blocking upload still reads sends the new values (vLLM
style input buffers); reading a preallocated buffer a download still fills sees old values.  Each
"catches it" test has a twin with the fix that stays silent."""
import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.analysis import analyze
from pytest_npugraph.trace import HostAccess


def _races(npugraph):
    return analyze(npugraph.trace, ["race"])


def _line_of(text):
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def _accesses(npugraph):
    return [r for r in npugraph.trace.records if type(r) is HostAccess]


WRITES = {
    "add_": lambda h: h.add_(1),
    "setitem": lambda h: h.__setitem__(0, 9.0),
    "iadd": lambda h: h.__iadd__(1),
    "copy_": lambda h: h.copy_(torch.zeros(4)),
    "out=": lambda h: torch.add(torch.ones(4), 1, out=h),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_writing_the_source_of_a_pending_h2d_copy_is_a_race(npugraph, write):
    staging = torch.ones(4).pin_memory()
    side = torch.npu.Stream()
    with npugraph.expect("race", match="CPU source of the non_blocking host-to-device"):
        with torch.npu.stream(side):
            dev = staging.to("npu", non_blocking=True)
        WRITES[write](staging)                       # the bug: the upload may still be reading it
    race, = _races(npugraph)
    assert race.streams[0].startswith("npu:0/stream") and race.streams[1] == "host"
    copy_site, write_site = race.where
    assert copy_site.endswith(f":{_line_of('dev = staging.to(')}")
    assert "test_user_host_buffers.py:" in write_site   # the write (one of WRITES' lambdas)
    assert "synchronize()" in race.message and "non_blocking=False" in race.message
    assert dev.shape == (4,)


@pytest.mark.parametrize("sync", ["stream", "device", "event"])
def test_writing_the_source_after_the_host_knows_the_copy_done_stays_silent(npugraph, sync):
    staging = torch.ones(4).pin_memory()
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        dev = staging.to("npu", non_blocking=True)
        done = torch.npu.Event()
        done.record()
    {"stream": side.synchronize, "device": torch.npu.synchronize, "event": done.synchronize}[sync]()
    staging.add_(1)
    assert dev.cpu().tolist() == [1.0] * 4
    npugraph.assert_clean()
    assert type(staging) is torch.Tensor             # the user's tensor is plain again


def test_reading_the_source_of_a_pending_h2d_copy_stays_silent(npugraph):
    staging = torch.arange(4.0)
    dev = torch.empty(4, device="npu")
    dev.copy_(staging, non_blocking=True)
    assert staging.sum().item() == 6.0               # both only read the host memory
    assert staging.tolist() == [0.0, 1.0, 2.0, 3.0]
    torch.npu.synchronize()
    assert dev.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert not _accesses(npugraph)
    npugraph.assert_clean()


def test_writing_the_buffer_a_pending_source_is_a_view_of_is_a_race(npugraph):
    """vLLM-style: the upload copies a slice of a persistent CPU buffer; the host refills the buffer."""
    buffer = torch.zeros(8).pin_memory()
    dev = torch.empty(4, device="npu")
    with npugraph.expect("race", match="CPU source"):
        dev.copy_(buffer[:4], non_blocking=True)
        buffer[2] = 5.0                                # inside the copied slice
    assert [a.access for a in _accesses(npugraph)] == ["write"]


def test_writing_another_part_of_the_buffer_stays_silent(npugraph):
    buffer = torch.zeros(8).pin_memory()
    dev = torch.empty(4, device="npu")
    dev.copy_(buffer[:4], non_blocking=True)
    buffer[6] = 5.0                                    # outside the copied slice
    buffer[4:].fill_(1.0)
    torch.npu.synchronize()
    assert dev.tolist() == [0.0] * 4
    npugraph.assert_clean()


def test_reading_a_pending_user_destination_is_a_race(npugraph):
    y = torch.arange(4.0, device="npu") * 2
    out = torch.empty(4).pin_memory()
    with npugraph.expect("race", match="CPU destination of the non_blocking device-to-host"):
        out.copy_(y, non_blocking=True)
        values = out.tolist()                          # the bug: no sync before reading out
    race, = _races(npugraph)
    assert race.ops == ["aten::copy_ (D2H)", "tolist()"]
    assert len(values) == 4


def test_reading_through_the_buffer_a_pending_destination_is_a_view_of_is_a_race(npugraph):
    y = torch.arange(4.0, device="npu")
    buffer = torch.zeros(8)
    with npugraph.expect("race", match="CPU destination"):
        buffer[:4].copy_(y, non_blocking=True)
        buffer[:2].sum()
    assert len(_races(npugraph)) == 1


def test_a_pending_destination_read_after_an_event_sync_stays_silent(npugraph):
    """The vLLM-Ascend fix: record an event after the download and synchronize it before reading."""
    y = torch.arange(4.0, device="npu") * 2
    buffer = torch.zeros(8)
    buffer[4:].fill_(7.0)
    buffer[:4].copy_(y, non_blocking=True)
    assert buffer[4:].sum().item() == 28.0             # another part of the buffer: no copy there
    done = torch.npu.Event()
    done.record()
    done.synchronize()
    assert buffer[:4].tolist() == [0.0, 2.0, 4.0, 6.0]
    npugraph.assert_clean()
    assert type(buffer) is torch.Tensor


def test_blocking_copies_leave_the_users_tensors_alone(npugraph):
    host = torch.ones(4)
    dev = host.to("npu")
    back = torch.empty(4)
    back.copy_(dev)
    host.add_(1)
    assert back.tolist() == [1.0] * 4
    assert type(host) is torch.Tensor and type(back) is torch.Tensor
    assert not _accesses(npugraph)
    npugraph.assert_clean()


def test_tensors_of_other_subclasses_are_not_switched(npugraph):
    weight = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    dev = torch.empty(4, device="npu")
    dev.copy_(weight, non_blocking=True)
    assert type(weight) is torch.nn.Parameter
    torch.npu.synchronize()
    npugraph.assert_clean()


def test_a_buffer_left_pending_by_a_test_is_plain_in_the_next(pytester):
    pytester.makepyfile(test_leftover="""
        import torch, torch_npu

        BUFFER = torch.zeros(4)

        def test_leaves_a_download_pending(npugraph):
            y = torch.ones(4, device="npu")
            BUFFER.copy_(y, non_blocking=True)       # never synchronized: the test ends with it pending

        def test_next_test_uses_the_buffer(npugraph):
            BUFFER.add_(1)
            assert type(BUFFER) is torch.Tensor
            npugraph.assert_clean()
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_upload_reads_the_source_when_its_task_runs(npugraph):
    """The upload reads the source when its task runs: queued behind other work, after the host wrote."""
    slow = torch.npu.Stream()
    staging = torch.ones(4)
    with npugraph.expect("race"):
        with torch.npu.stream(slow):
            gate = torch.npu.ExternalEvent()
            gate.wait(slow)                              # holds the stream until the record below
            dev = staging.to("npu", non_blocking=True)
        staging.fill_(3.0)                               # the bug: before the upload ran
        gate.record(torch.npu.current_stream())
        slow.synchronize()
    assert dev.cpu().tolist() == [3.0] * 4               # what the device really got


@pytest.mark.parametrize("poll", ["event", "stream"])
def test_a_read_after_query_says_done_stays_silent(npugraph, poll):
    """``query()`` returning True tells the host the work is done, as a synchronize does."""
    y = torch.arange(4.0, device="npu") * 2
    out = torch.empty(4)
    out.copy_(y, non_blocking=True)
    done = torch.npu.Event()
    done.record()
    while not (done.query() if poll == "event" else torch.npu.current_stream().query()):
        pass
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]
    npugraph.assert_clean()
