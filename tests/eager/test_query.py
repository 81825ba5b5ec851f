"""``Stream.query()`` / ``Event.query()`` (issue 24, item 5): a query tells the host that work finished
only when it answers True.  Work is never done the instant it is issued on hardware, so the first query
about work the host does not know finished answers False: a query whose answer is ignored orders
nothing (the race detector reports what follows it), a spin loop gets True on a later ask and is clean."""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T
from pytest_npugraph.runtime.executor import DeviceHang


def syncs(npugraph, what):
    return [r for r in npugraph.trace.records if isinstance(r, T.HostSync) and r.what == what]


def side_fill(a):
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        a.fill_(1)
    return s


def test_ignored_stream_query_orders_nothing(npugraph):
    a = torch.zeros(4, device="npu")
    s = side_fill(a)
    with npugraph.expect("race", match="aten::add_"):
        s.query()                                    # the answer (False) is ignored
        a.add_(1)                                    # on main: may run before the fill
    assert not syncs(npugraph, "stream")


def test_ignored_event_query_orders_nothing(npugraph):
    a = torch.zeros(4, device="npu")
    s = side_fill(a)
    done = s.record_event()
    with npugraph.expect("race", match="aten::add_"):
        done.query()
        a.add_(1)
    assert not syncs(npugraph, "event")


def test_stream_spin_loop_orders_and_is_clean(npugraph):
    a = torch.zeros(4, device="npu")
    s = side_fill(a)
    asks = 1
    while not s.query():
        asks += 1
    a.add_(1)
    assert asks == 2                                 # False, then True once the work ran
    assert a.cpu().tolist() == [2.0] * 4
    (sync,) = syncs(npugraph, "stream")
    assert npugraph.trace.streams[sync.stream].stream_id == s.stream_id
    npugraph.assert_clean()


def test_event_spin_loop_orders_and_is_clean(npugraph):
    a = torch.zeros(4, device="npu")
    s = side_fill(a)
    done = torch.npu.Event()
    done.record(s)
    while not done.query():
        pass
    a.add_(1)
    assert a.cpu().tolist() == [2.0] * 4
    assert len(syncs(npugraph, "event")) == 1
    npugraph.assert_clean()


def test_query_answers_true_at_once_when_the_host_already_knows(npugraph):
    s = torch.npu.Stream()
    assert s.query() is True                         # nothing issued
    with torch.npu.stream(s):
        torch.ones(2, device="npu")
    s.synchronize()
    assert s.query() is True                         # the synchronize told the host
    e = s.record_event()
    e.synchronize()
    assert e.query() is True and s.query() is True
    assert torch.npu.Event().query() is True         # never recorded


def test_new_work_makes_the_next_query_false_again(npugraph):
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.ones(2, device="npu")
    assert [s.query(), s.query()] == [False, True]
    with torch.npu.stream(s):
        torch.ones(2, device="npu")
    assert [s.query(), s.query()] == [False, True]


def test_query_of_work_held_by_a_wait_stays_false_until_it_runs(npugraph):
    gate = torch.npu.ExternalEvent()
    s = torch.npu.Stream()
    gate.wait(s)                                     # holds s until the record below
    with torch.npu.stream(s):
        torch.ones(2, device="npu")
    assert [s.query() for _ in range(5)] == [False] * 5
    gate.record()
    assert s.query() is True                         # it ran, and this query was not the first about it
    npugraph.assert_clean()


def test_spinning_on_work_that_can_never_run_is_a_device_hang_not_a_hung_test(npugraph):
    gate = torch.npu.ExternalEvent()
    s = torch.npu.Stream()
    gate.wait(s)                                     # no record will ever come
    with torch.npu.stream(s):
        torch.ones(2, device="npu")
    with npugraph.expect("event-misuse"), pytest.raises(DeviceHang):
        while not s.query():
            pass


QUERY_UNDER_SHUFFLE = """
import torch, torch_npu

def test_spin(npugraph):
    a = torch.zeros(4, device="npu")
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        a.fill_(1)
    done = s.record_event()
    while not done.query():
        pass
    while not s.query():
        pass
    a.add_(1)
    assert a.cpu().tolist() == [2.0] * 4
    npugraph.assert_clean()
"""


def test_spin_loops_end_under_the_shuffle_schedule(pytester):
    """Under shuffle, queued work runs only when the host waits: a poll lets the device go on."""
    pytester.makepyfile(test_spin=QUERY_UNDER_SHUFFLE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--npu-schedule=shuffle", "--npu-schedule-seed=3")
    result.assert_outcomes(passed=1)
