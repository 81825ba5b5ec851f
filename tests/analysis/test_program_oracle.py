"""Program oracle: random torch programs on the emulated device against a model that knows no trace.

Each program is a few lines of real user code on three streams: in-place writes and reads through
views of two tensors (column blocks, row blocks, interleaved elements, a transposed handle),
metadata-only in-place ops (``t_``, ``unsqueeze_``/``squeeze_``: they change how later views index
and run nothing), data-dependent ops (boolean-mask indexing, ``nonzero``: the host waits for their
stream), ``wait_stream`` and ``synchronize``.  The program runs on the emulator and the race analysis
reads its trace; independently, the model applies every view and metadata op to CPU tensors of
element indices (so which elements a line touches comes from torch's own view semantics, not from
``layout``), builds a trace of its own with one task per line, and gets the orders from the
brute-force schedule explorer of ``test_oracle``.  The two must name the same racing line pairs.

``NPUGRAPH_PROGRAM_EXAMPLES`` (default 60 in CI); ``python -m tests.analysis.test_program_oracle 2000``
is not available (the emulator needs the plugin): run
``NPUGRAPH_PROGRAM_EXAMPLES=2000 python -m pytest tests/analysis/test_program_oracle.py``.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import races

from .test_oracle import Schedules
from .tracebuild import Build

EXAMPLES = int(os.environ.get("NPUGRAPH_PROGRAM_EXAMPLES", "60"))
STREAMS = ("main", "s1", "s2")
# views valid for A (4x8), its handle At (4x8 or 8x4 after t_) and B (32)
VIEWS = ["A[:, :4]", "A[:, 4:]", "A[:, 2:6]", "A[1:3]", "A[:, 0::2]", "A[:, 1::2]", "A",
         "At[:2]", "At[:, :2]", "At[:, 2:]", "At[0::2]",
         "B[0::2]", "B[1::2]", "B[0::3]", "B[4:20]", "B[:16]", "B"]
WRITE, READ, MASK, NONZERO = "{v}.add_(1)", "outs.append({v}.sum())", "outs.append({v}[{v} > 0.5])", \
    "outs.append({v}.nonzero())"
METADATA = ["At.t_()", "At.unsqueeze_(0); At.squeeze_(0)"]


@st.composite
def programs(draw) -> list:
    """[(stream, statement, kind)]; kind: "write", "read", "host-read", "meta", "wait", "sync"."""
    lines = []
    for _ in range(draw(st.integers(2, 12))):
        what = draw(st.sampled_from(["write"] * 3 + ["read"] * 3 + ["host-read", "meta", "wait", "wait", "sync"]))
        stream = draw(st.sampled_from(STREAMS))
        view = draw(st.sampled_from(VIEWS))
        if what == "write":
            lines.append((stream, WRITE.format(v=view), what, view))
        elif what == "read":
            lines.append((stream, READ.format(v=view), what, view))
        elif what == "host-read":
            lines.append((stream, draw(st.sampled_from([MASK, NONZERO])).format(v=view), what, view))
        elif what == "meta":
            lines.append((stream, draw(st.sampled_from(METADATA)), what, None))
        elif what == "wait":
            waiter, waitee = draw(st.lists(st.sampled_from(STREAMS), min_size=2, max_size=2, unique=True))
            lines.append((waiter, f"{waiter}.wait_stream({waitee})", what, None))
        else:
            lines.append(("main", "torch.npu.synchronize()", what, None))
    return lines


def source(program) -> str:
    return "\n".join(f"with torch.npu.stream({stream}): {text}" for stream, text, _, _ in program)


def expected(program) -> set:
    """Racing line pairs ``{frozenset({(stream, line), (stream, line)})}`` from the model."""
    import torch

    index = {"A": torch.arange(32).view(4, 8), "B": torch.arange(32, 64)}
    index["At"] = index["A"].view(4, 8)
    b = Build(*STREAMS)
    touched = {}      # model record seq -> (stream, line, elements, writes)
    for line, (stream, text, what, view) in enumerate(program, 1):
        if what in ("write", "read", "host-read"):
            elements = set(eval(view, {}, index).flatten().tolist())
            seq = b.kernel(stream)
            touched[seq] = (stream, line, elements, what == "write")
            if what == "host-read":
                b.sync("read", stream=stream)
        elif what == "meta":
            exec(text, {}, index)
        elif what == "wait":
            waitee = text.split("(")[1].rstrip(")")
            b.wait_stream(stream, waitee)
        else:
            b.sync("device")
    sched = Schedules(b.trace)
    out = set()
    items = sorted(touched.items())
    for i, (a, (sa, la, ea, wa)) in enumerate(items):
        for x, (sx, lx, ex, wx) in items[i + 1:]:
            if sa != sx and (wa or wx) and ea & ex and sched.unordered(a, x):
                out.add(frozenset(((sa, la), (sx, lx))))
    return out


def renumbered(trace: T.Trace, start: int) -> T.Trace:
    """The records from ``start`` on, as a trace of their own (seqs from 0)."""
    sub = T.Trace(streams=dict(trace.streams), events=dict(trace.events), blocks=dict(trace.blocks))
    for i, rec in enumerate(trace.records[start:]):
        sub.append(dataclasses.replace(rec, seq=i))
    return sub


def found(trace: T.Trace, names: dict) -> set:
    return {frozenset((names[s], int(w.rsplit(":", 1)[1])) for s, w in zip(h.streams, h.where))
            for h in races.find(trace)}


@pytest.mark.npu_allow("race", "missing-record-stream", "core-limit", "deadlock")
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=programs())
def test_emulated_program_agrees_with_the_model(npugraph, program):
    import torch

    text = source(program)
    note(text)
    side1, side2 = torch.npu.Stream(), torch.npu.Stream()
    space = {"torch": torch, "main": torch.npu.current_stream(), "s1": side1, "s2": side2, "outs": []}
    exec("A = torch.rand(4, 8, device='npu'); B = torch.rand(32, device='npu'); At = A.view(4, 8)", space)
    torch.npu.synchronize()
    start = len(npugraph.trace)
    exec(compile(text, "<string>", "exec"), space)
    torch.npu.synchronize()
    names = {npugraph.trace.streams[sid].label: name for sid, name in
             ((s.sid, n) for n, s in (("main", _state(npugraph, space["main"])), ("s1", _state(npugraph, side1)),
                                      ("s2", _state(npugraph, side2))))}
    assert found(renumbered(npugraph.trace, start), names) == expected(program)


def _state(npugraph, stream):
    return npugraph.runtime.stream_by_id(stream.device_index, stream.stream_id)
