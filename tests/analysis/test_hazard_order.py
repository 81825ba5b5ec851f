"""The order of hazards: device by device, each device's in program order (``describe.by_device``,
applied by ``analyze`` to the analyses that report in trace order).

Why: ``run_ranks`` drives each device from its own thread, so the trace interleaves the ranks'
records in thread-timing order and stream ids come from a process-wide counter; the same program
must still give the same hazard list and report text on every run.  One device's hazards keep the
order the analyses give them (a single-device test reads exactly as before).
"""
from __future__ import annotations


from pytest_npugraph.analysis import analyze, describe, events, races, record_stream
from pytest_npugraph.hazard import Hazard
from pytest_npugraph.outcome import format_report

from .tracebuild import Build

INTERLEAVINGS = (       # (the device whose streams exist first, the device issuing each next call)
    (0, (0,) * 13 + (1,) * 13),
    (1, (1,) * 13 + (0,) * 13),
    (1, (1, 0) * 13),
    (0, (1, 1, 0, 1, 0, 0, 0, 1) * 3 + (0, 1)),
)


def two_ranks(first: int, interleave) -> Build:
    """The same racy program on npu:0 and npu:1, as ``run_ranks`` may record it: per rank a race
    pair (lines 11/12 and 12/14), a wait on an event never recorded (line 13) and a tensor freed
    without ``record_stream`` while its allocation stream goes on (lines 19, 20, 21).  Every call
    keeps its own source line whatever its position in the trace."""
    b = Build(devices=2)
    streams = {}
    for device in (first, 1 - first):
        streams.update({(device, name): b.stream(name, device) for name in ("main", "side")})
    for device in (0, 1):       # event labels come from the runtime's counter, not from this order
        b.event(f"never{device}")
        b.event(f"join{device}")

    def calls(d):
        main, side, x, y = streams[d, "main"], streams[d, "side"], f"x{d}", f"y{d}"
        return [
            lambda: b.alloc(x, stream=main, device=d, line=10),
            lambda: b.kernel(main, writes=b.view(x), op="aten::fill_", line=11),
            lambda: b.kernel(side, reads=b.view(x), op="aten::mul", line=12),
            lambda: b.wait(f"never{d}", side, line=13),
            lambda: b.kernel(main, writes=b.view(x), op="aten::add_", line=14),
            lambda: b.alloc(y, stream=main, device=d, line=15),
            lambda: b.kernel(main, writes=b.view(y), op="aten::fill_", line=16),
            lambda: b.record(f"join{d}", main, line=17),
            lambda: b.wait(f"join{d}", side, line=18),
            lambda: b.kernel(side, reads=b.view(y), op="aten::sum", line=19),
            lambda: b.free(y, line=20),
            lambda: b.kernel(main, op="aten::relu", line=21),
            lambda: b.kernel(side, op="aten::exp", line=22),
        ]

    pending = {0: calls(0), 1: calls(1)}
    for device in interleave:
        pending[device].pop(0)()
    assert not pending[0] and not pending[1]
    return b


def listed(hazards) -> list:
    return [(h.kind, h.message, h.where, h.streams, h.ops, h.severity) for h in hazards]


def test_two_ranks_hazards_are_listed_the_same_whatever_the_interleaving():
    reports = []
    for first, interleave in INTERLEAVINGS:
        found = analyze(two_ranks(first, interleave).trace)
        reports.append((listed(found), format_report(found)))
    assert all(report == reports[0] for report in reports[1:])
    hazards, text = reports[0]
    # one report per cause: each hazard of the program, on both devices, is one report, the first
    # device's text with both devices' streams (device by device), in program order
    assert [(kind, [s.split("/")[0] for s in streams], where) for kind, _, where, streams, _, _ in hazards] == [
        ("race", ["npu:0", "npu:0", "npu:1", "npu:1"], ["model.py:11", "model.py:12"]),
        ("race", ["npu:0", "npu:0", "npu:1", "npu:1"], ["model.py:12", "model.py:14"]),
        ("missing-record-stream", ["npu:0", "npu:0", "npu:1", "npu:1"], ["model.py:19", "model.py:20", "model.py:21"]),
        ("event-misuse", ["npu:0"], ["model.py:13"]),        # the events differ by name: two reports
        ("event-misuse", ["npu:1"], ["model.py:13"]),
    ]
    assert [message.endswith("\n(the same on npu:1)") for _, message, _, _, _, _ in hazards] == [True] * 3 + [False] * 2
    assert text.index("npu:0/side waits at model.py:13") < text.index("npu:1/side waits at model.py:13")


def test_each_trace_order_analysis_alone_is_device_by_device():
    """``analyze`` orders each analysis' list; the raw ``find`` keeps trace order (the rank that ran
    first comes first), which is what made reports differ."""
    b = two_ranks(1, (1,) * 13 + (0,) * 13)
    raw = [h.streams[0] for h in races.find(b.trace)]
    assert raw[0].startswith("npu:1/")
    for module in (races, record_stream, events):
        kinds = {h.kind for h in module.find(b.trace)}
        found = analyze(b.trace, kinds)          # device by device; a report of both devices lists npu:0's first
        per_hazard = [[s[:5] for s in h.streams] for h in found]
        firsts = [devices[0] for devices in per_hazard]
        assert firsts == sorted(firsts) and all(d == sorted(d) for d in per_hazard), module.__name__
        assert {d for devices in per_hazard for d in devices} == {"npu:0", "npu:1"}, module.__name__


def test_one_device_keeps_the_analyses_order():
    """Single-device lists are not re-sorted: races come in the order the engine finds them (at the
    later access: the pair 2/3 before the pair 1/5, though line 1 comes first), then each analysis'
    list after the one before, exactly as ``find`` returns them."""
    b = Build("main", "side")
    b.alloc("x", stream="main", line=90)
    b.alloc("y", stream="main", line=91)
    b.kernel("main", writes="x", line=1)
    b.kernel("main", writes="y", line=2)
    b.kernel("side", reads="y", line=3)
    b.wait("never", "side", line=4)
    b.kernel("side", reads="x", line=5)
    b.free("x", line=6)
    b.kernel("main", line=7)
    b.wait("never", "main", line=8)
    found = analyze(b.trace)
    assert [(h.kind, h.where) for h in found] == [
        ("race", ["model.py:2", "model.py:3"]),
        ("race", ["model.py:1", "model.py:5"]),
        ("missing-record-stream", ["model.py:5", "model.py:6", "model.py:7"]),
        ("event-misuse", ["model.py:4"]),
        ("event-misuse", ["model.py:8"]),
    ]
    assert listed(found) == listed(races.find(b.trace) + record_stream.find(b.trace) + events.find(b.trace))


def hazard(seq=None, streams=()) -> Hazard:
    return Hazard("race", f"at {seq}", seqs=() if seq is None else (seq,), streams=list(streams))


def test_by_device_reads_records_by_seq_and_puts_the_unknown_last():
    b = Build(devices=2)
    s0, s1 = b.stream("a", 0), b.stream("b", 1)
    k1 = b.kernel(s1)
    k0 = b.kernel(s0)
    sync = b.sync("device", device=1)
    hazards = [hazard(k1), hazard(), hazard(k0), hazard(sync), hazard(streams=["npu:0/a"])]
    assert [h.message for h in describe.by_device(b.trace, hazards)] == [
        f"at {k0}", "at None", f"at {k1}", f"at {sync}", "at None"]
    assert describe.by_device(b.trace, hazards)[1].streams == ["npu:0/a"]
    # ExternalEvent waits moved after their records (analysis/external_waits.py): seqs are not positions
    moved = b.trace.with_records(b.trace.records[::-1])
    assert describe.by_device(moved, hazards) == describe.by_device(b.trace, hazards)


def test_by_device_leaves_a_one_device_list_alone():
    b = Build(devices=2)
    s0 = b.stream("a", 0)
    first, second = b.kernel(s0), b.kernel(s0)
    hazards = [hazard(second), hazard(), hazard(first)]
    assert describe.by_device(b.trace, hazards) == hazards
