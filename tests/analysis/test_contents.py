"""The analyses' preconditions (analysis/contents.py) never change a verdict.

Two kinds of tests:

* what each analysis can report on one stream is still reported: host races, events waited before
  their record, limits out of range or ineffective, collectives that deadlock on one stream, reinplace
  vetoes.  Each trace is also checked with the preconditions off (``contents.FAST = False``);
* differential: ``analyze`` with and without the preconditions gives the same hazards (or the same
  analysis failure) on the random programs of the race oracle (tests/analysis/test_oracle.py), the
  deadlock oracle's scenarios (tests/analysis_cores/test_oracle.py), a generator mixing memory,
  events, external events, host accesses, collectives and limits, each also with every stream of a
  device folded onto one (so that the preconditions hold often), and random torch programs on the
  emulator (test_program_oracle.py) run on one stream.  Each test asserts that its examples took both
  sides of every precondition often enough for the agreement to mean something.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import (AnalysisError, analyze, contents, cores, deadlock, overwrite, races,
                                      record_stream, reinplace, super_kernel)

from analysis_cores.test_oracle import scenarios
from .test_oracle import programs
from .test_program_oracle import programs as torch_programs
from .test_program_oracle import source
from .tracebuild import Build, dump

EXAMPLES = 300
DIFFERENTIAL = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextlib.contextmanager
def full_analyses():
    """Every analysis runs in full (no precondition skips one)."""
    saved, contents.FAST = contents.FAST, False
    try:
        yield
    finally:
        contents.FAST = saved


def verdict(trace):
    """What ``analyze`` says: its hazards, or the failed analyses and the others' hazards."""
    try:
        return "ok", analyze(trace)
    except AnalysisError as exc:
        return "error", [(name, type(e).__name__, str(e)) for name, e in exc.failures], exc.hazards


def same_verdict(trace):
    """``analyze`` with and without the preconditions: the same result; returns it."""
    fast = verdict(trace)
    with full_analyses():
        slow = verdict(trace)
    assert fast == slow, dump(trace)
    return fast


def kinds(trace) -> list:
    return [h.kind for h in same_verdict(trace)[1]]


# ------------------------------------------------- single-stream hazards are still reported
def test_a_one_stream_trace_skips_the_cross_stream_models():
    b = Build("main")
    b.alloc("x")
    b.kernel("main", writes="x")
    b.kernel("main", reads="x")
    b.free("x")
    b.sync("read", stream="main")
    facts = contents.of(b.trace)
    assert all(getattr(facts, name) for name in NAMES)
    assert same_verdict(b.trace) == ("ok", [])


def test_host_race_on_one_stream_is_reported():
    b = Build("main")
    b.alloc("x")
    copy = b.kernel("main", reads="x", op="aten::copy_")     # a non_blocking device-to-host copy
    b.marker(T.HostAccess, copy=copy, access="read", op="aten::sum")
    assert contents.of(b.trace).no_conflicts
    assert kinds(b.trace) == ["race"]
    b.sync("stream", stream="main")
    b.marker(T.HostAccess, copy=copy, access="read", op="aten::sum", line=99)   # after the sync: silent
    assert kinds(b.trace) == ["race"]


def test_a_wait_on_an_event_recorded_later_on_the_same_stream_is_reported():
    b = Build("main")
    b.wait("e", "main")
    b.record("e", "main")
    assert contents.of(b.trace).no_conflicts and contents.of(b.trace).no_deadlock
    assert kinds(b.trace) == ["event-misuse"]


def test_an_external_event_waited_before_its_record_on_the_same_stream_deadlocks():
    b = Build("main")
    b.event("x", external=True)
    b.wait("x", "main")
    b.alloc("t")
    b.kernel("main", writes="t")
    b.record("x", "main")
    assert contents.of(b.trace).no_deadlock
    assert kinds(b.trace) == ["deadlock"]


def test_an_external_event_never_recorded_then_synchronized_on_one_stream_is_reported():
    b = Build("main")
    b.event("x", external=True)
    b.wait("x", "main")
    b.sync("device")
    assert kinds(b.trace) == ["event-misuse"]


def test_a_block_allocated_on_a_stream_that_runs_no_kernel_is_silent_until_it_does():
    b = Build("main", "side")
    b.alloc("x", stream="side")
    b.kernel("main", writes="x")
    b.free("x")
    b.kernel("main", reads=())
    assert contents.of(b.trace).no_conflicts
    assert kinds(b.trace) == []
    b.kernel("side", op="aten::next")      # the allocation stream's next work: the rule applies
    assert not contents.of(b.trace).no_conflicts
    assert kinds(b.trace) == ["missing-record-stream"]


@pytest.mark.parametrize("cube, vector", [(25, -1), (0, -1), (-1, 49), (-1, -2)])
def test_a_limit_out_of_range_on_one_stream_is_reported(cube, vector):
    b = Build(devices=1)
    s = b.stream()
    b.limit(s, cube, vector)
    b.kernel(s, op="add", vector=8)
    assert not contents.of(b.trace).no_core_hazards
    assert "core-limit" in kinds(b.trace)


def test_a_device_limit_out_of_range_is_reported_with_no_kernel():
    b = Build(devices=1)
    b.marker(T.DeviceLimit, device=0, cube=30, vector=-1)
    assert kinds(b.trace) == ["core-limit"]


def test_a_kernel_limit_without_a_marker_on_one_stream_is_reported():
    b = Build(devices=1)
    s = b.stream()
    b.limits[s] = [0, 64]
    b.kernel(s, op="add", vector=8)
    assert kinds(b.trace) == ["core-limit"]


def test_an_ineffective_limit_on_one_stream_is_reported():
    b = Build(devices=1)
    s = b.stream()
    b.limit(s, -1, 8)
    b.kernel(s, op="aicpu_op", kind="AICPU", vector=0, limit_applies=False)
    b.kernel(s, op="static_op", vector=48, resident=True, limit_applies=False)
    found = same_verdict(b.trace)[1]
    assert [(h.kind, h.severity) for h in found] == [("limit-ineffective", "warning"), ("limit-ineffective", "error")]


def test_resident_ops_on_two_streams_of_a_device_are_checked():
    b = Build(devices=1, vector=48)
    s1, s2 = b.stream(), b.stream()
    b.kernel(s1, op="nonzero", vector=40, resident=True)
    b.kernel(s2, op="nonzero", vector=40, resident=True)
    facts = contents.of(b.trace)
    assert not facts.no_core_hazards and not facts.no_deadlock
    assert "core-limit" in kinds(b.trace) or "deadlock" in kinds(b.trace)


def test_resident_ops_one_stream_per_device_are_skipped():
    b = Build(devices=2, vector=48)
    for device in range(2):
        s = b.stream(device=device)
        b.kernel(s, op="nonzero", vector=48, resident=True)
        b.kernel(s, op="nonzero", vector=48, resident=True)
    facts = contents.of(b.trace)
    assert facts.no_core_hazards and facts.no_deadlock
    assert kinds(b.trace) == []


def test_one_collective_issued_twice_on_one_stream_deadlocks():
    """A send to self on one stream: the first member waits for its peer queued behind it."""
    b = Build(devices=1)
    s = b.stream()
    b.collective(s, "hccl::send", "p2p", 1, vector=2)
    b.collective(s, "hccl::recv", "p2p", 1, vector=2)
    assert not contents.of(b.trace).no_deadlock
    assert kinds(b.trace) == ["deadlock"]


def test_a_collective_whose_other_device_never_issues_it_deadlocks_on_one_stream():
    b = Build(devices=2)
    b.marker(T.GroupCreated, group="tp", devices=(0, 1))
    s = b.stream(device=0)
    b.collective(s, "all_reduce", "tp", 1, vector=8)
    assert kinds(b.trace) == ["deadlock"]


def test_collectives_in_different_orders_one_stream_per_device_are_reported():
    b = Build(devices=2)
    s0, s1 = b.stream(device=0), b.stream(device=1)
    b.collective(s0, "all_reduce", "tp", 1, vector=8)
    b.collective(s1, "all_gather", "tp", 1, vector=8)
    assert "deadlock" in kinds(b.trace)


def test_a_reinplace_veto_on_one_stream_is_reported():
    b = Build("main")
    v = T.ReinplaceVerdict("graph_1", "add", "aten::add.Tensor", "aten::add_.Tensor", "vetoed", "inplaceable",
                           "disable_reinplace_inplaceable_ops_pass", ("0", "1"), (("mul", "0", None), ("sub", "1", None)))
    b.marker(T.Reinplace, verdict=v)
    assert kinds(b.trace) == ["reinplace-conflict"]


def replay_kernel(b, stream, call: int, writes, line=None, op="aten::mul"):
    return b.kernel(stream, writes=writes, op=op, line=line, graph=T.GraphCall("graph_1", "k", call))


def test_an_output_overwritten_by_the_next_replay_on_one_stream_is_reported():
    b = Build("main")
    b.alloc("out")
    replay_kernel(b, "main", 1, "out")
    b.marker(T.GraphOutputs, "main", call=T.GraphCall("graph_1", "k", 1), spans=(b.view("out"),))
    replay_kernel(b, "main", 2, "out")
    b.marker(T.GraphOutputRead, "main", call=T.GraphCall("graph_1", "k", 1), span=b.view("out"))
    b.kernel("main", reads="out")
    facts = contents.of(b.trace)
    assert facts.no_conflicts and not facts.no_overwrite
    assert kinds(b.trace) == ["output-overwrite"]


def test_a_pool_block_a_replay_wrote_over_on_one_stream_is_reported():
    b = Build("main")
    bid = b.alloc("mine")
    b.trace.blocks[bid] = dataclasses.replace(b.trace.blocks[bid], pool="(1, 0)")
    replay_kernel(b, "main", 1, T.Span(0, b.trace.blocks[bid].lo, b.trace.blocks[bid].hi, bid + 1))
    b.kernel("main", reads="mine")
    assert kinds(b.trace) == ["output-overwrite"]


EARLY = T.OpCores(kind="AIV", vector=48, early_start=True)


def test_super_kernel_hazards_on_one_stream_are_reported():
    b = Build("main")
    b.alloc("x")
    b.kernel("main", writes="x", cores=EARLY)                     # outside any scope: a warning
    assert not contents.of(b.trace).no_super_kernel
    assert [(h.kind, h.severity) for h in same_verdict(b.trace)[1]] == [("super-kernel", "warning")]
    b = Build("main")
    b.alloc("x")
    b.marker(T.SuperKernelBegin, "main", name="decode")
    b.kernel("main", writes="x", cores=EARLY)
    b.kernel("main", reads="x")                                   # starts before its producer ends
    assert [(h.kind, h.severity) for h in same_verdict(b.trace)[1]] == [("super-kernel", "error")] * 2   # + never ended
    b = Build("main")
    b.marker(T.SuperKernelEnd, "main", name="decode")            # an end with no begin
    assert kinds(b.trace) == ["super-kernel"]


def test_the_preconditions_hold_each_analysis_to_its_rule_when_called_alone():
    """Called outside ``analyze`` (no cache), each analysis applies its precondition the same way."""
    b = Build("main", "side")
    b.alloc("x")
    b.kernel("main", writes="x")
    b.kernel("side", reads="x")
    assert [c.kind for c in races.conflicts(b.trace)] == ["race"]
    collapsed = folded(b.trace, blocks=True)
    assert races.conflicts(collapsed) == [] and record_stream.find(collapsed) == []
    assert cores.find(collapsed) == [] and deadlock.find(collapsed) == []
    assert overwrite.find(collapsed) == [] and super_kernel.find(collapsed) == [] and reinplace.find(collapsed) == []


# ------------------------------------------------------------------------- differential
def folded(trace: T.Trace, blocks: bool) -> T.Trace:
    """``trace`` with every stream of a device replaced by that device's first stream (``blocks``:
    the blocks' allocation streams too): a program of the same shape on one stream per device."""
    first: dict = {}
    for sid, info in trace.streams.items():
        first.setdefault(info.device, sid)
    to = {sid: first[info.device] for sid, info in trace.streams.items()}
    out = T.Trace(streams=dict(trace.streams), events=dict(trace.events),
                  blocks={bid: dataclasses.replace(b, stream=to.get(b.stream, b.stream)) if blocks else b
                          for bid, b in trace.blocks.items()})
    for rec in trace.records:
        sid = getattr(rec, "stream", None)
        out.append(dataclasses.replace(rec, stream=to[sid]) if sid in to else rec)
    return out


SHAPES = st.sampled_from(["as drawn", "one stream per device", "one stream per device, blocks too"])


def shaped(trace: T.Trace, shape: str) -> T.Trace:
    return trace if shape == "as drawn" else folded(trace, blocks=shape.endswith("too"))


NAMES = ("no_conflicts", "no_core_hazards", "no_deadlock", "no_overwrite", "no_super_kernel", "no_reinplace")


def tally(seen: Counter, trace: T.Trace) -> None:
    facts = contents.of(trace)
    for name in NAMES:
        seen[name, getattr(facts, name)] += 1


def enough(seen: Counter, floor: int, names=NAMES) -> None:
    assert all(seen[name, value] >= floor for name in names for value in (True, False)), sorted(seen.items(), key=str)


def test_race_oracle_programs_get_the_same_hazards():
    seen: Counter = Counter()

    @DIFFERENTIAL
    @given(programs(), SHAPES)
    def agree(trace, shape):
        trace = shaped(trace, shape)
        same_verdict(trace)
        tally(seen, trace)
        seen["hazards"] += bool(verdict(trace)[1])

    agree()
    enough(seen, EXAMPLES // 10, names=("no_conflicts",))
    assert seen["hazards"] >= EXAMPLES // 10, seen


def test_deadlock_oracle_scenarios_get_the_same_hazards():
    seen: Counter = Counter()

    @DIFFERENTIAL
    @given(scenarios(), SHAPES)
    def agree(trace, shape):
        trace = shaped(trace, shape)
        same_verdict(trace)
        tally(seen, trace)
        seen["deadlock"] += "deadlock" in [h.kind for h in verdict(trace)[1]]

    agree()
    enough(seen, EXAMPLES // 20, names=("no_core_hazards", "no_deadlock"))
    assert seen["deadlock"] >= EXAMPLES // 20, seen


@st.composite
def mixed(draw) -> T.Trace:
    """1-2 devices, mostly one stream each: memory (views, frees, reuse, record_stream), events (also
    external ones waited before their record, and resets), host syncs and host accesses of copies,
    kernels with core profiles (resident, ignoring limits), collectives (a member issued twice, a
    group declared wider than its issuers, mismatched ops), stream and device limits."""
    devices = draw(st.integers(1, 2))
    b = Build(devices=devices, cube=draw(st.sampled_from([0, 2, 24])), vector=draw(st.sampled_from([2, 4, 48])))
    streams = [[b.stream(device=d) for _ in range(draw(st.sampled_from([1, 1, 2, 3])))] for d in range(devices)]
    live: list = []
    for d in range(devices):
        for i in range(2):
            name = f"t{d}{i}"
            b.alloc(name, size=8, stream=draw(st.sampled_from(streams[d])), device=d)
            live.append((d, name))
    pool: list = []
    for d in range(devices):
        bid = b.alloc(f"p{d}", size=8, stream=streams[d][0], device=d)
        b.trace.blocks[bid] = dataclasses.replace(b.trace.blocks[bid], pool="(1, 0)")
        pool.append((d, f"p{d}"))
    for name in ("e0", "e1"):
        b.event(name)
    b.event("x", external=True)
    event = st.sampled_from(["e0", "e1", "x"])
    kernels: list = []
    for _ in range(draw(st.integers(1, 20))):
        d = draw(st.integers(0, devices - 1))
        s = draw(st.sampled_from(streams[d]))
        what = draw(st.sampled_from(["kernel"] * 4 + ["collective", "group", "record", "wait", "reset", "sync",
                                                      "host access", "limit", "limit", "device limit", "record_stream",
                                                      "free", "replay", "outputs", "output read", "scope",
                                                      "reinplace"]))
        mine = [name for dev, name in live + pool if dev == d]
        call = T.GraphCall("g1", None, draw(st.integers(0, 2)))
        if what == "kernel":
            spans = [b.view(draw(st.sampled_from(mine)), *draw(st.sampled_from([(0, 8), (0, 4), (4, 8)])))
                     for _ in range(2)] if mine else [(), ()]
            reads, writes = draw(st.sampled_from([(spans[:1], ()), ((), spans[:1]), (spans[:1], spans[1:])])) \
                if mine else ((), ())
            kernels.append(b.kernel(s, reads=reads, writes=writes, op=draw(st.sampled_from(["add", "nonzero"])),
                                    cube=draw(st.integers(0, 2)), vector=draw(st.integers(0, 4)),
                                    line=draw(st.sampled_from([None, 777])),
                                    cores=T.OpCores(draw(st.sampled_from(["AIV", "AICPU"])), draw(st.integers(0, 2)),
                                                    draw(st.integers(0, 4)), draw(st.integers(0, 3)) == 0,
                                                    draw(st.booleans()), draw(st.integers(0, 5)) == 0)))
        elif what == "replay" and mine:      # a captured (replay 0) or replayed task of graph g1
            mine_pool = [name for dev, name in pool if dev == d]
            span = b.view(draw(st.sampled_from(mine_pool if mine_pool and draw(st.booleans()) else mine)))
            if draw(st.booleans()):          # captured when the memory belonged to another, dead tensor
                span = dataclasses.replace(span, block=99999)
            kernels.append(b.kernel(s, writes=span, op="aten::add_.Tensor", line=777, graph=call))
        elif what == "outputs" and mine:
            b.marker(T.GraphOutputs, s, call=call, spans=(b.view(draw(st.sampled_from(mine))),))
        elif what == "output read" and mine:
            b.marker(T.GraphOutputRead, s, call=call, span=b.view(draw(st.sampled_from(mine))))
        elif what == "scope":
            b.marker(draw(st.sampled_from([T.SuperKernelBegin, T.SuperKernelEnd])), s, name="sk",
                     options=draw(st.sampled_from(["", "stream-fusion=1"])))
        elif what == "reinplace":
            verdict = T.ReinplaceVerdict("g1", "add", "aten::add.Tensor", "aten::add_.Tensor",
                                         draw(st.sampled_from(["applied", "vetoed", "disabled"])), "inplaceable",
                                         "disable_reinplace_inplaceable_ops_pass", ("0", "1"), (("mul", "0", None),))
            b.marker(T.Reinplace, verdict=verdict, line=777)
        elif what == "collective":
            b.collective(s, draw(st.sampled_from(["all_reduce", "all_gather", "hccl::send", "hccl::recv"])), "g",
                         draw(st.integers(1, 2)), vector=draw(st.integers(0, 3)), resident=draw(st.booleans()))
        elif what == "group":
            b.marker(T.GroupCreated, group="g", devices=tuple(sorted(draw(st.sets(st.integers(0, 1), min_size=1)))))
        elif what == "record":
            b.record(draw(event), s)
        elif what == "wait":
            b.wait(draw(event), s)
        elif what == "reset":
            b.marker(T.EventReset, event=b.event("x"))
        elif what == "sync":
            how = draw(st.sampled_from(["device", "stream", "read", "event"]))
            b.sync(how, stream=s if how in ("stream", "read") else None,
                   event=draw(event) if how == "event" else None, device=d)
        elif what == "host access" and kernels:
            b.marker(T.HostAccess, copy=draw(st.sampled_from(kernels)), access=draw(st.sampled_from(["read", "write"])),
                     op="aten::sum", role=draw(st.sampled_from(["destination", "source"])))
        elif what == "limit":
            b.limit(s, draw(st.integers(-1, 3)), draw(st.integers(-1, 5)))
        elif what == "device limit":
            b.marker(T.DeviceLimit, device=d, cube=draw(st.integers(-1, 3)), vector=draw(st.integers(-1, 5)))
        elif what == "record_stream" and mine:
            b.record_stream(draw(st.sampled_from(mine)), s)
        elif what == "free" and mine:
            old = draw(st.sampled_from(mine))
            b.free(old)
            (live if (d, old) in live else pool).remove((d, old))
            if draw(st.booleans()):
                new = f"t{d}{len(b.bids)}"
                b.alloc(new, size=8, reuses=old, device=d)
                live.append((d, new))
    return b.trace


def test_mixed_programs_get_the_same_hazards():
    seen: Counter = Counter()

    @DIFFERENTIAL
    @given(mixed(), SHAPES)
    def agree(trace, shape):
        trace = shaped(trace, shape)
        found = same_verdict(trace)[1]
        tally(seen, trace)
        for h in found:
            seen[h.kind] += 1

    agree()
    enough(seen, EXAMPLES // 20, names=NAMES)
    # one-stream programs report what they can: the kinds the preconditions must not hide
    missing = [kind for kind in ("race", "event-misuse", "core-limit", "limit-ineffective",
                                 "deadlock", "output-overwrite", "super-kernel", "reinplace-conflict") if not seen[kind]]
    assert not missing, missing


PROGRAMS = 40


@settings(max_examples=PROGRAMS, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=torch_programs())
def test_emulated_one_stream_programs_get_the_same_hazards(npugraph, program):
    """Random torch programs of the program oracle run on the emulator with every stream the default
    one (the trace of a typical test, which the preconditions skip): the trace so far, every example."""
    import torch

    text = source(program)
    note(text)
    main = torch.npu.current_stream()
    space = {"torch": torch, "main": main, "s1": main, "s2": main, "outs": []}
    exec("A = torch.rand(4, 8, device='npu'); B = torch.rand(32, device='npu'); At = A.view(4, 8)", space)
    exec(compile(text, "<string>", "exec"), space)
    torch.npu.synchronize()
    trace = npugraph.trace.with_records(npugraph.trace.records[:])
    facts = contents.of(trace)
    assert all(getattr(facts, name) for name in NAMES)
    assert same_verdict(trace) == ("ok", [])
