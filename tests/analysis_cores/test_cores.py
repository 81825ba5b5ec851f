"""core-limit and limit-ineffective: each rule catches its case and stays silent on the fix."""
from __future__ import annotations

import re

import pytest

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import cores

from analysis.tracebuild import Build

from .scenarios import seed


def kinds(trace, kind):
    return [h for h in cores.find(trace) if h.kind == kind]


def one(trace, kind):
    found = kinds(trace, kind)
    assert len(found) == 1, [str(h) for h in cores.find(trace)]
    return found[0]


# ----------------------------------------------------------------------------- range
@pytest.mark.parametrize("cube, vector, bad, why", [
    (25, -1, "cube_num=25", "exceeds the device"), (-1, 49, "vector_num=49", "exceeds the device"),
    (0, -1, "cube_num=0", "leaves no core"), (-1, -2, "vector_num=-2", "not a core count")])
def test_stream_limit_outside_device_range(cube, vector, bad, why):
    b = Build(devices=1)
    s = b.stream("side", 0)
    b.limit(s, cube, vector)
    hazard = one(b.trace, "core-limit")
    assert bad in hazard.message and why in hazard.message and "npu:0/side" in hazard.message
    assert hazard.where == ["model.py:2"] and hazard.streams == ["npu:0/side"]


@pytest.mark.parametrize("cube, vector", [(1, 1), (24, 48), (-1, -1), (12, -1)])
def test_stream_limit_inside_range_is_silent(cube, vector):
    b = Build(devices=1)
    b.limit(b.stream(), cube, vector)
    assert cores.find(b.trace) == []


def test_device_limit_out_of_range_and_zero_on_a_chip_without_vector_cores():
    b = Build(devices=2)
    b.marker(T.DeviceLimit, device=1, cube=30, vector=-1)
    assert re.search(r"set_device_limit\(1, cube_num=30\).*\[1, 24\]", one(b.trace, "core-limit").message)
    b = Build(devices=1, cube=20, vector=0)
    b.limit(b.stream(), 8, 0)
    assert cores.find(b.trace) == []


def test_kernel_limit_without_a_marker_is_checked_once_per_stream():
    b = Build(devices=1)
    s = b.stream()
    b.limits[s] = [0, 64]   # e.g. a graph-mode scope the runtime recorded only on kernels
    b.kernel(s, op="add", vector=8)
    b.kernel(s, op="mul", vector=8)
    hazard = one(b.trace, "core-limit")
    assert "vector limit 64 in force when add was issued" in hazard.message


# ------------------------------------------------------------------------ k-way sum
def three_limited_streams(ordered: bool, resident: bool = True) -> Build:
    b = Build(devices=1)
    streams = [b.stream(f"s{i}", 0) for i in range(3)]
    for s in streams:
        b.limit(s, vector=20)
    for i, s in enumerate(streams):
        if ordered and i:
            b.wait_stream(s, streams[i - 1])
        b.kernel(s, op=f"op{i}", vector=48, resident=resident)
    return b


def test_three_streams_limited_to_20_of_48_each_concurrent():
    hazard = one(three_limited_streams(ordered=False).trace, "core-limit")
    assert hazard.severity == "error"
    assert "3 ops on npu:0 may run at the same time and need 60 vector cores" in hazard.message
    assert hazard.ops == ["op0", "op1", "op2"] and len(hazard.where) == 3


def test_three_limited_streams_ordered_by_events_are_silent():
    assert cores.find(three_limited_streams(ordered=True).trace) == []


def test_limited_streams_that_are_not_resident_break_only_the_docs_rule():
    hazard = one(three_limited_streams(ordered=False, resident=False).trace, "core-limit")
    assert hazard.severity == "warning" and "streams running at once" in hazard.message


def test_pairs_that_fit_are_silent_even_when_a_third_would_not_overlap():
    b = Build(devices=1)
    a, c, d = (b.stream() for _ in range(3))
    b.kernel(a, op="rs", vector=24, resident=True)
    b.kernel(c, op="ag", vector=24, resident=True)
    b.wait_stream(d, a)
    b.wait_stream(d, c)
    b.kernel(d, op="nonzero", vector=48, resident=True)   # after both: never with them
    assert cores.find(b.trace) == []


def test_cube_pool_is_checked_too():
    b = Build(devices=1)
    x, y = b.stream(), b.stream()
    b.kernel(x, op="mm_allreduce", cube=16, kind="MC2", resident=True)
    b.kernel(y, op="matmul_sync", cube=16, kind="AICore", resident=True)
    assert "need 32 cube cores" in one(b.trace, "core-limit").message


def test_seed_scenario_oversubscribes_and_its_fix_is_clean():
    """One cause, one report: the same streams oversubscribing both cards are listed in one hazard."""
    found = kinds(seed().trace, "core-limit")
    assert [h.message.split(": ")[0] for h in found] == [
        "3 ops on npu:0 may run at the same time and need 88 vector cores together, but the device has 48"]
    (hazard,) = found
    assert "; the same on npu:1." in hazard.message
    assert {s.split("/")[0] for s in hazard.streams} == {"npu:0", "npu:1"} and len(hazard.streams) == 6
    assert hazard.summary == ("3 ops on npu:0, npu:1 may run at the same time and need 88 vector cores together, "
                              "but the device has 48 (reduce_scatter 16, dispatch_combine 24, nonzero 48)")
    assert cores.find(seed(nonzero_limit=8).trace) == []
    assert kinds(seed(nonzero_limit=9).trace, "core-limit")


def test_ops_taking_turns_on_one_stream_are_one_report_naming_each():
    """MoE dispatch then combine on one stream, each beside the same two ops: one cause, one report."""
    b = Build(devices=1)
    rs, ep, nz = (b.stream(name, 0) for name in ("hccl", "moe", "compute"))
    b.kernel(rs, op="reduce_scatter", vector=16, resident=True)
    b.kernel(ep, op="dispatch", vector=24, resident=True)
    b.kernel(ep, op="combine", vector=24, resident=True)
    b.kernel(nz, op="nonzero", vector=48, resident=True)
    hazard = one(b.trace, "core-limit")
    assert re.search(r"also with combine \(.*\): 24 in its stream's place", hazard.message)
    assert hazard.ops == ["reduce_scatter", "dispatch", "nonzero", "combine"]
    assert "the same on" not in hazard.message


def test_different_streams_oversubscribing_stay_separate_reports():
    """Two causes on one device (different stream sets, ordered apart by a wait) are two reports; the
    sets on streams a and c (first beside second, then beside fourth) are one."""
    b = Build(devices=1)
    a, c, d = (b.stream(name, 0) for name in ("a", "c", "d"))
    b.kernel(a, op="first", vector=40, resident=True)
    b.kernel(c, op="second", vector=40, resident=True)
    b.record("e", c)
    b.wait("e", d)
    b.record("f", a)
    b.wait("f", d)
    b.kernel(d, op="third", vector=40, resident=True)
    b.kernel(c, op="fourth", vector=40, resident=True)
    found = kinds(b.trace, "core-limit")
    assert len(found) == 2, [h.message for h in found]
    assert [sorted(h.streams) for h in found] == [["npu:0/a", "npu:0/c"], ["npu:0/c", "npu:0/d"]]
    assert [sorted(h.ops) for h in found] == [["first", "fourth", "second"], ["fourth", "third"]]


# ------------------------------------------------------------------ limit-ineffective
def limited_op(kind: str, resident: bool = False, vector: int = 48, beside: bool = False) -> Build:
    b = Build(devices=1)
    s = b.stream("limited", 0)
    if beside:
        b.kernel(b.stream("other", 0), op="matmul", vector=48)
    b.limit(s, vector=8)
    b.kernel(s, op=f"{kind.lower()}_op", kind=kind, vector=vector, resident=resident, limit_applies=False)
    return b


def test_aicpu_op_under_a_limit_warns_that_the_limit_is_only_misleading():
    hazard = one(limited_op("AICPU", vector=0).trace, "limit-ineffective")
    assert hazard.severity == "warning" and "AICPU ops run on the AI CPU" in hazard.message


def test_resident_atb_op_under_a_limit_is_an_error_explaining_it_is_not_protected():
    hazard = one(limited_op("ATB", resident=True).trace, "limit-ineffective")
    assert hazard.severity == "error"
    assert "ATB ops do not take core limits" in hazard.message
    assert "will not stop it from starving or deadlocking" in hazard.message


def test_static_kernel_beside_another_core_user_is_an_error():
    hazard = one(limited_op("AIV", beside=True).trace, "limit-ineffective")
    assert hazard.severity == "error" and "static kernel" in hazard.message
    assert "matmul on npu:0/other" in hazard.message


def test_limit_that_applies_or_no_limit_is_silent():
    b = Build(devices=1)
    s = b.stream()
    b.kernel(s, op="atb_op", kind="ATB", vector=48, limit_applies=False)   # no limit in force
    b.limit(s, vector=8)
    b.kernel(s, op="swiglu", vector=48)                                    # the limit binds it
    b.limit(s, vector=48)                                               # the maximum: no limit
    b.kernel(s, op="atb_op", kind="ATB", vector=48, limit_applies=False)
    assert kinds(b.trace, "limit-ineffective") == []


def test_launches_from_one_call_site_are_one_hazard():
    b = Build(devices=1)
    s = b.stream()
    b.limit(s, vector=8)
    for line in (7, 7, 7, 9):  # a loop body at line 7, then another call at line 9
        b.kernel(s, op="atb_op", kind="ATB", vector=48, limit_applies=False, line=line)
    first, second = kinds(b.trace, "limit-ineffective")
    assert "(3 launches)" in first.message and len(first.seqs) == 3 and first.where == ["model.py:7"]
    assert "launches" not in second.message and second.where == ["model.py:9"]
