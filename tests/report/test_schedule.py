"""The ASAP schedule behind every picture: stream order, event waits, host syncs, and collectives
whose members start together across devices."""
from pytest_npugraph.report.schedule import KERNEL_US, LAUNCH_US, schedule

from analysis.tracebuild import Build


def test_streams_run_in_order_and_side_streams_overlap():
    b = Build("main", "side")
    b.alloc("x", 1)
    first = b.kernel("main", writes="x")
    second = b.kernel("main", reads="x")
    side = b.kernel("side")
    slots = schedule(b.trace)
    assert slots[second].start == slots[first].end          # same stream: back to back
    assert slots[side].start < slots[second].end            # another stream: overlaps
    assert slots[first].end - slots[first].start >= KERNEL_US


def test_an_event_wait_delays_the_waiting_stream_until_the_record_fires():
    b = Build("main", "side")
    work = b.kernel("main")
    b.record("e", "main")
    wait = b.wait("e", "side")
    after = b.kernel("side")
    slots = schedule(b.trace)
    assert slots[wait].start == slots[work].end
    assert slots[after].start >= slots[work].end


def test_a_host_sync_holds_back_later_launches_of_its_device_only():
    b = Build("main")
    b.stream("other", device=1)
    long = b.kernel("main", writes=(), op="aten::mm")
    b.sync("stream", stream="main")
    later = b.kernel("main")
    on_other_device = b.kernel("other")
    slots = schedule(b.trace)
    assert slots[later].start >= slots[long].end + LAUNCH_US
    assert slots[on_other_device].start < slots[long].end      # its own host thread did not block


def test_members_of_a_collective_start_together_when_the_last_can():
    b = Build("r0")
    b.stream("r1", device=1)
    for _ in range(3):
        b.kernel("r0")                                          # rank 0 is busy first
    a = b.kernel("r0", op="hccl::all_reduce", collective=("g", 0))
    z = b.kernel("r1", op="hccl::all_reduce", collective=("g", 0))
    after = b.kernel("r1")
    slots = schedule(b.trace)
    assert slots[a].start == slots[z].start > 3 * KERNEL_US
    assert slots[after].start >= slots[z].end


def test_host_records_get_the_time_the_host_reached_them():
    b = Build("main")
    b.alloc("x", 8)
    k = b.kernel("main", writes="x")
    b.sync("stream", stream="main")
    free = b.free("x")
    slots = schedule(b.trace)
    assert slots[free].stream == b.sids["main"] and slots[free].start >= slots[k].end
