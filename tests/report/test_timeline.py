"""Chrome-trace JSON: tracks per device and stream, slices with cores and lines, event and
collective flows, hazard markers with their status, and truncation that keeps what hazards name."""
import json

from pytest_npugraph.hazard import Hazard
from pytest_npugraph.report.timeline import chrome_trace, write
from pytest_npugraph import trace as T
from pytest_npugraph.trace import OpCores

from analysis.tracebuild import Build


def two_devices():
    b = Build("main", "side")
    b.stream("r1", device=1)
    return b


def events_of(data, ph=None, cat=None):
    return [e for e in data["traceEvents"] if (ph is None or e["ph"] == ph) and (cat is None or e.get("cat") == cat)]


def test_tracks_per_device_and_stream_and_slices_with_cores_limits_and_lines():
    b = two_devices()
    b.alloc("x", 64)
    mm = b.kernel("main", writes="x", op="aten::mm", cores=OpCores("AICore", cube=24), cube_limit=8)
    data = chrome_trace(b.trace)
    names = {(e["pid"], e["args"]["name"]) for e in events_of(data, "M") if e["name"] == "process_name"}
    assert names == {(0, "npu:0"), (1, "npu:1")}
    tracks = {e["args"]["name"]: e["pid"] for e in events_of(data, "M") if e["name"] == "thread_name"}
    assert tracks == {"npu:0/main": 0, "npu:0/side": 0, "npu:1/r1": 1}
    (s,) = events_of(data, "X")
    assert (s["name"], s["cat"], s["tid"]) == ("mm", "AICore", b.sids["main"])
    assert s["args"]["where"] == f"model.py:{mm + 1}" and s["args"]["cube"] == 24 and s["args"]["cube_limit"] == 8
    assert s["args"]["written_bytes"] == 64 and s["dur"] > 0


def test_event_record_and_wait_are_a_flow_from_the_recording_to_the_waiting_stream():
    b = Build("main", "side")
    b.kernel("main")
    rec = b.record("e", "main")
    b.wait("e", "side")
    b.wait("never", "side")
    data = chrome_trace(b.trace)
    start, finish = events_of(data, cat="event")
    assert (start["ph"], start["tid"], finish["ph"], finish["tid"]) == ("s", b.sids["main"], "f", b.sids["side"])
    assert start["id"] == finish["id"] == rec and finish["ts"] >= start["ts"]
    waits = events_of(data, cat="wait")
    assert [w["args"]["recorded"] for w in waits] == [True, False]


def test_a_collective_is_one_flow_through_its_members_on_every_device():
    b = two_devices()
    b.kernel("main", op="hccl::all_reduce", collective=("hccl/0", 3))
    b.kernel("r1", op="hccl::all_reduce", collective=("hccl/0", 3))
    b.kernel("r1", op="hccl::barrier", collective=("hccl/0", 4))      # a lone member draws nothing
    flow = events_of(data := chrome_trace(b.trace), cat="collective")
    assert [(e["ph"], e["pid"]) for e in flow] == [("s", 0), ("f", 1)]
    assert flow[0]["name"] == "hccl/0#3" and flow[0]["ts"] == flow[1]["ts"]
    assert {e["args"].get("collective") for e in events_of(data, "X")} == {"hccl/0#3", "hccl/0#4"}


def test_hazards_are_markers_on_their_tasks_with_status_and_listed_in_other_data():
    b = Build("main", "side")
    b.alloc("x", 8)
    w = b.kernel("main", writes="x")
    r = b.kernel("side", reads="x")
    h = Hazard("race", "race on x", where=["model.py:2", "model.py:3"], streams=["npu:0/main", "npu:0/side"],
               seqs=(w, r))
    data = chrome_trace(b.trace, [h], {h.key: "expected"})
    marks = events_of(data, "i", "hazard")
    assert {m["tid"] for m in marks} == {b.sids["main"], b.sids["side"]}
    assert all(m["name"] == "HAZARD race" and m["args"]["status"] == "expected" for m in marks)
    assert data["otherData"]["hazards"] == [{"kind": "race", "status": "expected", "severity": "error",
                                             "message": "race on x", "where": h.where, "streams": h.streams,
                                             "ops": []}]


def test_host_syncs_and_markers_are_instants_and_the_device_marker_is_not():
    b = Build("main")
    b.kernel("main")
    b.sync("device")
    b.marker(T.CaptureBegin, stream="main")
    data = chrome_trace(b.trace)
    assert [(e["name"], e["s"]) for e in events_of(data, "i")] == [("sync device", "p"), ("capture_begin", "t")]


def test_truncation_keeps_the_first_tasks_and_every_task_a_hazard_names(tmp_path):
    b = Build("main")
    seqs = [b.kernel("main", op=f"aten::op{i}") for i in range(50)]
    h = Hazard("race", "late", seqs=(seqs[40],))
    data = chrome_trace(b.trace, [h], max_tasks=10)
    assert [e["name"] for e in events_of(data, "X")] == [f"op{i}" for i in range(10)] + ["op40"]
    assert data["otherData"]["truncated"] and len(events_of(data, "i", "hazard")) == 1
    write(tmp_path / "t.json", b.trace, [h])
    assert len(events_of(json.loads((tmp_path / "t.json").read_text()), "X")) == 50
