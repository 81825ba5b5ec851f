"""Kind ``race``: CSAN's TestEventHandler cases (anchors §1.7) plus what CSAN misses."""
from __future__ import annotations

import time

import pytest

from pytest_npugraph.analysis import races

from .tracebuild import Build


def found(b: Build) -> list:
    return races.find(b.trace)


def streams_of(hazards) -> set:
    return {frozenset(h.streams) for h in hazards}


# ---------------------------------------------------------------- CSAN TestEventHandler
def test_empty_kernel_launch():
    b = Build("s0", "s1")
    b.kernel("s0")
    b.kernel("s1")
    assert found(b) == []


def test_simple_passing_two_readers():
    b = Build("s0", "s1")
    b.alloc("a")
    b.kernel("s0", reads="a")
    b.kernel("s1", reads="a")
    assert found(b) == []


def test_simple_error_read_then_write():
    b = Build("s0", "s1")
    b.alloc("a")
    r = b.kernel("s0", reads="a")
    w = b.kernel("s1", writes="a")
    [h] = found(b)
    assert h.seqs == (r, w) and h.streams == ["npu:0/s0", "npu:0/s1"]


def test_simple_sync():
    b = Build("s0", "s1")
    b.alloc("a")
    b.kernel("s0", reads="a")
    b.record("e", "s0")
    b.wait("e", "s1")
    b.kernel("s1", writes="a")
    assert found(b) == []


def test_reads_check_last_write():
    b = Build("s0", "s1", "s2")
    b.alloc("a")
    w = b.kernel("s0", writes="a")
    b.record("e", "s0")
    b.wait("e", "s1")
    b.kernel("s1", reads="a")
    r = b.kernel("s2", reads="a")
    [h] = found(b)
    assert h.seqs == (w, r)


def test_branch_sync_readers_ok_writer_needs_both():
    b = Build("s0", "s1", "s2")
    b.alloc("a")
    b.kernel("s0", writes="a")
    b.record("e", "s0")
    for s in ("s1", "s2"):
        b.wait("e", s)
        b.kernel(s, reads="a")
    assert found(b) == []
    b.kernel("s0", writes="a")
    assert streams_of(found(b)) == {frozenset({"npu:0/s0", "npu:0/s1"}), frozenset({"npu:0/s0", "npu:0/s2"})}


def test_chain_sync_through_ten_streams():
    names = [f"s{i}" for i in range(10)]
    b = Build(*names)
    b.alloc("a")
    b.kernel("s0", writes="a")
    for prev, nxt in zip(names, names[1:]):
        b.record(f"e{prev}", prev)
        b.wait(f"e{prev}", nxt)
    b.kernel("s9", writes="a")
    assert found(b) == []


def test_expired_record_does_not_cover_later_work():
    b = Build("s0", "s1")
    b.alloc("a")
    b.record("e", "s0")
    w = b.kernel("s0", writes="a")
    b.wait("e", "s1")
    r = b.kernel("s1", reads="a")
    [h] = found(b)
    assert h.seqs == (w, r)


def test_deleted_record_recreated_event_gives_no_order():
    b = Build("s0", "s1")
    b.alloc("a")
    b.kernel("s0", writes="a")
    b.record("old", "s0")
    b.wait("new", "s1")  # a re-created event object: never recorded
    b.kernel("s1", reads="a")
    assert len(found(b)) == 1


@pytest.mark.parametrize("waited", [9, 10])
def test_all_reads_checked(waited):
    names = [f"s{i}" for i in range(11)]
    b = Build(*names)
    b.alloc("a")
    for s in names[1:]:
        b.kernel(s, reads="a")
        b.record(f"e{s}", s)
    for s in names[1:1 + waited]:
        b.wait(f"e{s}", "s0")
    b.kernel("s0", writes="a")
    hazards = found(b)
    if waited == 10:
        assert hazards == []
    else:
        assert streams_of(hazards) == {frozenset({"npu:0/s10", "npu:0/s0"})}


def test_multiple_errors_one_per_tensor():
    b = Build("s0", "s1")
    b.alloc("a")
    b.alloc("b")
    b.kernel("s0", reads=("a", "b"))
    b.kernel("s1", writes=("a", "b"))
    (hazard,) = found(b)          # one report per pair of lines, naming both tensors
    assert hazard.message.count("the tensor allocated at") == 2


def test_correct_state_merging_is_pointwise_max():
    b = Build("s0", "s1", "s2")
    b.alloc("a")
    b.alloc("b")
    b.kernel("s0", writes="a")
    b.record("e0", "s0")
    b.kernel("s1", writes="b")
    b.record("e1", "s1")
    b.wait("e0", "s2")
    b.wait("e1", "s2")
    b.kernel("s2", reads=("a", "b"))
    b.wait("e1", "s2")  # merging an older clock again must not lose anything
    b.kernel("s2", writes=("a", "b"))
    assert found(b) == []


def test_record_override():
    b = Build("s0", "s1", "s2")
    b.alloc("a")
    b.kernel("s0", writes="a")
    b.record("e", "s0")
    b.record("e", "s2")
    b.wait("e", "s1")
    b.kernel("s1", reads="a")
    assert len(found(b)) == 1


def test_one_event_waited_by_two_streams():
    b = Build("s0", "s1", "s2")
    b.alloc("a")
    b.kernel("s0", writes="a")
    b.record("e", "s0")
    b.wait("e", "s1")
    b.wait("e", "s2")
    b.kernel("s1", reads="a")
    b.kernel("s2", reads="a")
    assert found(b) == []


# ---------------------------------------------------------------- beyond CSAN
@pytest.mark.parametrize("first, second, race", [
    ((0, 32), (16, 48), True),    # partial overlap of two views
    ((0, 32), (32, 64), False),   # adjacent halves
    ((8, 16), (0, 64), True),     # slice inside the whole
    ((0, 64), (63, 64), True),    # one byte at the edge
])
def test_views_conflict_by_byte_range(first, second, race):
    b = Build("s0", "s1")
    b.alloc("a")
    b.kernel("s0", writes=b.view("a", *first))
    b.kernel("s1", reads=b.view("a", *second))
    assert bool(found(b)) == race


def test_split_segments_keep_their_history():
    b = Build("s0", "s1")
    b.alloc("a")
    w = b.kernel("s0", writes="a")
    b.record("e", "s0")
    b.kernel("s1", reads=b.view("a", 0, 16))  # unsynchronised: races with the whole write
    b.wait("e", "s1")
    b.kernel("s1", reads=b.view("a", 16, 64))
    [h] = found(b)
    assert h.seqs[0] == w and "overlapping in its bytes [0, 16)" in h.message


def test_other_device_same_addresses_do_not_conflict():
    b = Build("s0")
    b.stream("far", device=1)
    b.alloc("a")
    b.alloc("z", stream="far", device=1, at=0)
    b.kernel("s0", writes="a")
    b.kernel("far", writes="z")
    assert found(b) == []


def test_three_stream_event_chain():
    b = Build("s0", "s1", "s2")
    b.alloc("a")
    b.kernel("s0", writes="a")
    b.record("e01", "s0")
    b.wait("e01", "s1")
    b.record("e12", "s1")
    b.wait("e12", "s2")
    b.kernel("s2", writes="a")
    assert found(b) == []
    c = Build("s0", "s1", "s2")
    c.alloc("a")
    c.kernel("s0", writes="a")
    c.record("e12", "s1")  # s1 records without having waited for s0
    c.wait("e12", "s2")
    c.kernel("s2", writes="a")
    assert len(found(c)) == 1


@pytest.mark.parametrize("join", [True, False])
def test_fork_join_with_wait_stream(join):
    b = Build("main", "side")
    b.alloc("x")
    b.alloc("y")
    b.kernel("main", writes="x")
    b.wait_stream("side", "main")   # fork
    b.kernel("side", reads="x", writes="y")
    if join:
        b.wait_stream("main", "side")
    b.kernel("main", reads="y", writes="x")
    assert bool(found(b)) != join


def test_host_synchronize_orders_later_work():
    b = Build("s0", "s1")
    b.alloc("a")
    b.kernel("s0", writes="a")
    b.sync("device")
    b.kernel("s1", writes="a")
    assert found(b) == []


def test_one_report_for_20000_reads_then_one_write():
    """CSAN reports 20,000 errors here (anchors §1.8); one bug is one report."""
    b = Build("main", "side")
    b.alloc("weight")
    for _ in range(20_000):
        b.kernel("main", reads="weight", line=10)
    b.kernel("side", writes="weight", line=20)
    start = time.perf_counter()
    hazards = found(b)
    assert len(hazards) == 1 and hazards[0].where == ["model.py:10", "model.py:20"]
    assert time.perf_counter() - start < 30   # generous (load must not fail it): quadratic work takes minutes


def test_one_report_for_a_write_then_20000_unsynchronised_reads():
    b = Build("main", "side")
    b.alloc("x")
    b.kernel("main", writes="x", line=10)
    for _ in range(20_000):
        b.kernel("side", reads="x", line=11)
    assert len(found(b)) == 1


def test_same_lines_same_tensor_in_both_orders_is_one_report():
    b = Build("main", "side")
    b.alloc("x")
    for _ in range(3):
        b.kernel("main", writes="x", line=10)
        b.kernel("side", writes="x", line=11)
    assert len(found(b)) == 1


def test_report_names_accesses_allocation_and_fix():
    b = Build("main", "side")
    b.alloc("x", stream="main", line=3)
    w = b.kernel("main", writes="x", op="aten::add_", line=12)
    r = b.kernel("side", reads="x", op="aten::mul", line=15)
    [h] = found(b)
    assert h.kind == "race"
    assert h.where == ["model.py:12", "model.py:15"]
    assert h.streams == ["npu:0/main", "npu:0/side"] and h.ops == ["aten::add_", "aten::mul"]
    assert h.seqs == (w, r)
    for text in ("npu:0/side reads it in aten::mul at model.py:15", "writing it in aten::add_ at model.py:12",
                 "allocated at model.py:3", "record an event on npu:0/main after line model.py:12",
                 "wait for it on npu:0/side before line model.py:15"):
        assert text in h.message


def test_reused_memory_after_use_on_its_own_stream_is_a_race():
    """Old tensor used on its allocation stream, new owner written on another stream."""
    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("main", reads="x")
    b.free("x")
    b.alloc("y", stream=None, reuses="x")
    b.kernel("side", writes="y")
    [h] = found(b)
    assert "changed owner" in h.message and "freed at model.py:3" in h.message


def test_reused_memory_after_cross_stream_use_is_not_a_race_but_missing_record_stream():
    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("side", reads="x")
    b.free("x")
    b.alloc("y", stream=None, reuses="x")
    b.kernel("main", writes="y")
    assert found(b) == []
    [c] = races.conflicts(b.trace)
    assert c.kind == "missing-record-stream"


def test_record_streamed_overlap_without_reuse_link_is_silent():
    """The allocator would not hand out memory with a pending recorded use."""
    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("side", reads="x")
    b.record_stream("x", "side")
    b.free("x")
    b.alloc("y", stream="main", at=0)  # same bytes, no ``reuses`` (e.g. a merged chunk)
    b.kernel("main", writes="y")
    assert races.conflicts(b.trace) == []


def test_one_pair_of_lines_racing_on_memory_that_changed_owner_three_times_is_one_short_report():
    """A loop reusing one block: the first owner change in full, the other owners by allocation line
    (the report carried one 'memory that changed owner ... allocated at' clause per reuse)."""
    b = Build("main", "side")
    b.alloc("x0", stream="main", line=3)
    b.kernel("main", reads="x0", line=4)
    b.free("x0", line=5)
    previous = "x0"
    for i, line in zip(range(1, 4), (6, 7, 8)):
        b.alloc(f"x{i}", stream=None, reuses=previous, line=line)
        b.kernel("side", writes=f"x{i}", line=9)
        if i < 3:
            b.free(f"x{i}", line=10)
        previous = f"x{i}"
    hazards = found(b)
    assert len(hazards) == 1, [h.message for h in hazards]
    (h,) = hazards
    assert h.message.count("changed owner") == 1
    assert "(and on 2 more tensor(s) that took that memory over, allocated at model.py:7, model.py:8)" in h.message


def test_a_race_on_one_tensor_names_no_other():
    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("main", writes="x")
    b.kernel("side", reads="x")
    (h,) = found(b)
    assert "more tensor" not in h.message
