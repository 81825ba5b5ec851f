"""Happens-before semantics (CSAN's, anchors §1.4/1.5, exact for host issue order)."""
from __future__ import annotations

from pytest_npugraph import trace as T
from pytest_npugraph.analysis.happens_before import HappensBefore, of

from .tracebuild import Build


def hb(b: Build) -> HappensBefore:
    return HappensBefore(b.trace)


def test_same_stream_is_program_order():
    b = Build("s0", "s1")
    k1, k2 = b.kernel("s0"), b.kernel("s0")
    h = hb(b)
    assert h.ordered(k1, k2) and not h.ordered(k2, k1) and not h.ordered(k1, k1)


def test_streams_without_synchronisation_are_unordered():
    b = Build("s0", "s1")
    k1, k2 = b.kernel("s0"), b.kernel("s1")
    h = hb(b)
    assert not h.ordered(k1, k2) and not h.ordered(k2, k1)


def test_event_orders_only_work_before_its_record():
    b = Build("s0", "s1")
    before = b.kernel("s0")
    b.record("e", "s0")
    after = b.kernel("s0")
    b.wait("e", "s1")
    k = b.kernel("s1")
    h = hb(b)
    assert h.ordered(before, k) and not h.ordered(after, k)


def test_work_issued_before_the_wait_is_not_ordered():
    b = Build("s0", "s1")
    k0 = b.kernel("s0")
    b.record("e", "s0")
    early = b.kernel("s1")
    b.wait("e", "s1")
    late = b.kernel("s1")
    h = hb(b)
    assert not h.ordered(k0, early) and h.ordered(k0, late)


def test_rerecord_overrides_earlier_record():
    b = Build("s0", "s1", "s2")
    k = b.kernel("s0")
    b.record("e", "s0")
    b.record("e", "s2")  # the wait now refers to this record only
    b.wait("e", "s1")
    k1 = b.kernel("s1")
    assert not hb(b).ordered(k, k1)


def test_wait_on_never_recorded_event_orders_nothing():
    b = Build("s0", "s1")
    k = b.kernel("s0")
    b.wait("e", "s1")
    b.record("e", "s0")  # a later record does not reach back
    k1 = b.kernel("s1")
    assert not hb(b).ordered(k, k1)


def test_transitive_chain_through_three_streams():
    b = Build("s0", "s1", "s2")
    k0 = b.kernel("s0")
    b.record("a", "s0")
    b.wait("a", "s1")
    b.record("b", "s1")
    b.wait("b", "s2")
    k2 = b.kernel("s2")
    h = hb(b)
    assert h.ordered(k0, k2)
    assert h.clock(k2)[b.sids["s0"]] >= k0


def test_device_sync_orders_that_device_only():
    b = Build("s0", "s1")
    other = b.stream("far", device=1)
    k0, kf = b.kernel("s0"), b.kernel("far")
    b.sync("device", device=0)
    k1 = b.kernel("s1")
    k2 = b.kernel("far")
    h = hb(b)
    assert h.ordered(k0, k1) and h.ordered(k0, k2)
    assert not h.ordered(kf, k1)
    assert other in b.trace.streams


def test_stream_and_read_sync_cover_that_stream_only():
    for what in ("stream", "read"):
        b = Build("s0", "s1", "s2")
        k0, k1 = b.kernel("s0"), b.kernel("s1")
        b.sync(what, stream="s0")
        k2 = b.kernel("s2")
        h = hb(b)
        assert h.ordered(k0, k2) and not h.ordered(k1, k2), what


def test_event_sync_covers_the_latest_record():
    b = Build("s0", "s1")
    k0 = b.kernel("s0")
    b.record("e", "s0")
    k_after = b.kernel("s0")
    b.sync("event", event="e")
    k1 = b.kernel("s1")
    h = hb(b)
    assert h.ordered(k0, k1) and not h.ordered(k_after, k1)


def test_host_knowledge_orders_work_issued_after_it_not_before():
    b = Build("s0", "s1")
    k0 = b.kernel("s0")
    pending = b.kernel("s1")  # issued before the sync: may still run before k0
    sync = b.sync("stream", stream="s0")
    issued_after = b.kernel("s1")
    h = hb(b)
    assert h.ordered(k0, sync) and not h.ordered(pending, sync)
    assert not h.ordered(k0, pending) and h.ordered(k0, issued_after)


def test_new_stream_starts_from_the_host_clock():
    b = Build("s0")
    k0 = b.kernel("s0")
    b.sync("device")
    b.stream("late")
    k1 = b.kernel("late")
    assert hb(b).ordered(k0, k1)


def test_host_actions_precede_everything_issued_after_them():
    b = Build("s0", "s1")
    b.alloc("x", stream="s0")
    free = b.free("x")
    k = b.kernel("s1")
    h = hb(b)
    assert h.ordered(free, k) and not h.ordered(k, free)


def test_reuse_of_a_record_streamed_block_waits_for_the_recorded_use():
    """The allocator hands out the address only after the events it recorded at the free."""
    for named, reuse, expected in (("s1", True, True), ("s1", False, False), ("s0", True, False)):
        b = Build("s0", "s1")
        b.alloc("x", stream="s0")
        use = b.kernel("s1", reads="x")
        b.record_stream("x", named)  # naming the allocation stream itself does nothing
        b.free("x")
        b.alloc("y", stream="s0", reuses="x" if reuse else None)
        k = b.kernel("s0", writes="y")
        assert hb(b).ordered(use, k) == expected, (named, reuse)


def test_streams_missing_from_the_table_are_added():
    b = Build("s0")
    k0 = b.kernel("s0")
    b.record("e", "s0")
    b.trace.append(T.EventWait(b.trace.next_seq, 999, b.event("e")))
    k1 = b.trace.next_seq
    b.trace.append(T.Kernel(k1, 999, "op"))
    h = hb(b)
    assert h.ordered(k0, k1) and h.index[999] == 1


def test_seqs_need_not_be_positions():
    recs = [T.Kernel(10, 1, "a"), T.EventRecord(20, 1, 7), T.EventWait(30, 2, 7), T.Kernel(40, 2, "b"),
            T.Kernel(50, 1, "c")]
    tr = T.Trace(records=recs, streams={s: T.StreamInfo(s, 0, s, f"npu:0/{s}") for s in (1, 2)})
    h = HappensBefore(tr)
    assert h.ordered(10, 40) and not h.ordered(50, 40) and not h.ordered(40, 50)


def test_of_memoizes_per_trace_and_length():
    b = Build("s0")
    b.kernel("s0")
    cache: dict = {}
    first = of(b.trace, cache)
    assert of(b.trace, cache) is first
    b.kernel("s0")
    assert of(b.trace, cache) is not first
    assert of(Build("s0").trace, cache) is not first
