"""Memory facts (frees, the streams ``record_stream`` named before the free) are worked out once per
trace and shared by the happens-before model, the race engine and the missing-record_stream rule."""
from pytest_npugraph.analysis import analyze, memory

from .tracebuild import Build


def _reuse_trace():
    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("side", writes="x")
    b.record_stream("x", "side")
    b.free("x")
    b.record_stream("x", "main")            # after the free: the allocator never sees it
    b.alloc("y", reuses="x")
    b.kernel("main", writes="y")
    return b


def test_facts_keep_only_record_stream_before_the_free():
    b = _reuse_trace()
    facts = memory.compute(b.trace)
    x, y = b.bids["x"], b.bids["y"]
    assert facts.recorded_at_free(x) == {b.sids["side"]}
    assert facts.free[x].block == x and facts.freed_before(x, len(b.trace.records))
    assert not facts.freed_before(x, facts.free_pos[x])
    assert y not in facts.free


def test_one_analysis_run_computes_the_facts_once(monkeypatch):
    calls = []
    real = memory.compute
    monkeypatch.setattr(memory, "compute", lambda trace: calls.append(1) or real(trace))
    analyze(_reuse_trace().trace)
    assert len(calls) == 1


def test_the_recorded_stream_keeps_the_reuse_clean_and_its_absence_is_reported():
    assert analyze(_reuse_trace().trace, ["race", "missing-record-stream"]) == []
    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("side", writes="x")
    b.free("x")
    b.alloc("y", reuses="x")
    b.kernel("main", writes="y")
    assert [h.kind for h in analyze(b.trace, ["race", "missing-record-stream"])] == ["missing-record-stream"]
