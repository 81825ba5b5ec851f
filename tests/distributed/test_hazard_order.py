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
    side = "stream-0"
    # one report per root cause: each hazard of the rank body, on both devices, is one report listing both
    assert found == [
        ("race", [fill, read], ["npu:0/default", f"npu:0/{side}", "npu:1/default", f"npu:1/{side}"]),
        ("race", [read, write], [f"npu:0/{side}", "npu:0/default", f"npu:1/{side}", "npu:1/default"]),
        ("event-misuse", [wait], [f"npu:0/{side}", f"npu:1/{side}"]),
    ]
    # the report text is the first device's (an event's label numbers the events its rank's thread made,
    # whichever rank made one first), ending with the other device
    text = format_report(npugraph.hazards)
    assert "Event#1 of rank 0 " in text and "Event#1 of rank 1 " not in text and "npu:1" not in text.replace(
        "(the same on npu:1)", "")
    assert [p.rstrip().endswith("(the same on npu:1)") for p in text.split("\n--- ")[1:]] == [True] * 3
    made = "(streams made at: npu:0/stream-0 at tests/distributed/%s)" % line_of("side = torch.npu.Stream()")
    assert text.count(made) == 3                       # each report lists the line that made its stream
