"""Real ranks: the hazards of a racy ``run_ranks`` program read the same whichever rank's thread
runs first (device by device, each rank's in program order).

Why: each rank is a thread, so the trace interleaves their records in thread-timing order; the
report used to list whichever rank ran first first.  Here a condition variable makes one rank run
its whole body before the other, in both orders.
"""
import re
import threading

import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.outcome import format_report

pytestmark = [pytest.mark.npu_devices(2), pytest.mark.npu_allow("race", "event-misuse")]


def line_of(text: str) -> str:
    with open(__file__) as f:
        return "test_hazard_order.py:%d" % next(i for i, line in enumerate(f, 1)
                                                 if text in line and "line_of" not in line)


def racy(first: int):
    turn = threading.Condition()
    state = {"turn": first}

    def rank(r):
        with turn:
            assert turn.wait_for(lambda: state["turn"] == r, timeout=30)
        x = torch.ones(64, device=f"npu:{r}")           # fill
        side = torch.npu.Stream()
        with torch.npu.stream(side):
            y = x * 2                                   # races with the fill
        x.add_(1)                                       # races with the read
        ev = torch.npu.Event()
        side.wait_event(ev)                             # never recorded
        with turn:
            state["turn"] = 1 - r
            turn.notify_all()
        return y

    return rank


@pytest.mark.parametrize("first", [0, 1])
def test_hazards_are_listed_device_by_device_whichever_rank_runs_first(npugraph, first):
    npugraph.run_ranks(racy(first))
    fill, read, write, wait = (line_of(t) for t in ("# fill", "# races with the fill", "# races with the read",
                                                     "# never recorded"))
    found = [(h.kind, [w.rsplit("/", 1)[-1] for w in h.where], h.streams) for h in npugraph.hazards]
    assert found == [
        ("race", [fill, read], ["npu:0/default", "npu:0/stream-0"]),
        ("race", [read, write], ["npu:0/stream-0", "npu:0/default"]),
        ("race", [fill, read], ["npu:1/default", "npu:1/stream-0"]),
        ("race", [read, write], ["npu:1/stream-0", "npu:1/default"]),
        ("event-misuse", [wait], ["npu:0/stream-0"]),
        ("event-misuse", [wait], ["npu:1/stream-0"]),
    ]
    # the report text: the same on both devices but for the device, the rank and the addresses (an
    # event's label numbers the events its rank's thread made, whichever rank made one first)
    text = format_report(npugraph.hazards)
    assert "Event#1 of rank 0 " in text and "Event#1 of rank 1 " in text
    text = re.sub(r"0x[0-9a-f]+", "ADDR", text)
    parts = [p.split(". ", 1)[1].strip() for p in text.split("\n--- ")[1:]]     # without the numbers
    assert [p.replace("npu:1", "npu:0").replace("rank 1", "rank 0") for p in parts[2:4] + parts[5:]] == \
        parts[:2] + parts[4:5]
