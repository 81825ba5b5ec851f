"""Single-device oracle for host/device races: random programs with non_blocking copies both ways,
host reads of their destinations, host writes of their sources and host syncs, against brute force
over schedules.

Each program is a few lines of real user code on two streams: device work, ``non_blocking`` copies
to the host (into a new tensor, or into one the user made: ``z.copy_(A, non_blocking=True)``), host
reads of a copy's destination, ``non_blocking`` uploads from a host buffer and host writes of that
buffer, ``wait_stream``, stream/device synchronize, an event recorded then synchronized, and a
blocking ``.item()``.  The emulator runs it and host_races.py reads
its trace; independently the model builds a trace of its own (tests/analysis/tracebuild.py) and asks
the brute-force schedule explorer of tests/analysis/test_oracle.py whether some schedule lets the
host read run before the copy.  The two must name the same (copy line, read line) pairs: a missed race
and a false one both fail.  ``NPUGRAPH_HOST_EXAMPLES`` (default 150; 300 pass in about 20 s).
"""
from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from analysis.test_oracle import Schedules
from analysis.test_program_oracle import renumbered
from analysis.tracebuild import Build
from pytest_npugraph import trace as T
from pytest_npugraph.analysis import host_races

EXAMPLES = int(os.environ.get("NPUGRAPH_HOST_EXAMPLES", "150"))
STREAMS = ("main", "s1")
KINDS = ["work", "work", "copy", "copy", "copy", "read", "read", "read", "read", "read", "wait", "sync-stream",
         "sync-device", "event", "item", "upload", "upload", "write", "write", "write"]


@st.composite
def programs(draw) -> list:
    """[(stream, statement, kind, copy or upload index)]."""
    lines, copies, uploads = [], 0, 0
    for _ in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(KINDS))
        s = draw(st.sampled_from(STREAMS))
        if kind == "work":
            lines.append((s, "A.add_(1)", kind, None))
        elif kind == "copy":
            if draw(st.booleans()):
                lines.append((s, f"z{copies} = A.to('cpu', non_blocking=True)", kind, copies))
            else:
                lines.append((s, f"z{copies} = torch.empty(4, 8); z{copies}.copy_(A, non_blocking=True)", kind, copies))
            copies += 1
        elif kind == "upload":
            lines.append((s, f"h{uploads} = torch.ones(4, 8); u{uploads} = h{uploads}.to('npu', non_blocking=True)",
                          kind, uploads))
            uploads += 1
        elif kind == "write" and uploads:
            i = draw(st.integers(0, uploads - 1))
            lines.append((s, f"h{i}[1:3].fill_(2.0)", kind, i))
        elif kind == "read" and copies:
            i = draw(st.integers(0, copies - 1))
            lines.append((s, f"outs.append(z{i}.sum())", kind, i))
        elif kind == "wait":
            other = STREAMS[1 - STREAMS.index(s)]
            lines.append((s, f"{s}.wait_stream({other})", kind, None))
        elif kind == "sync-stream":
            lines.append((s, f"{s}.synchronize()", kind, None))
        elif kind == "sync-device":
            lines.append((s, "torch.npu.synchronize()", kind, None))
        elif kind == "event":
            lines.append((s, f"ev = torch.npu.Event(); ev.record({s}); ev.synchronize()", kind, None))
        elif kind == "item":
            lines.append((s, "outs.append(A.sum().item())", kind, None))
    return lines


def source(program) -> str:
    return "\n".join(f"with torch.npu.stream({s}): {text}" for s, text, _, _ in program)


def expected(program) -> set:
    """``{(copy line, read line)}``: some schedule runs the host read before the copy."""
    b = Build(*STREAMS)
    copies, uploads, uses = {}, {}, []   # index -> (seq, line); [(access seq, (copy seq, copy line), line)]
    for line, (s, _, kind, i) in enumerate(program, 1):
        if kind == "work":
            b.kernel(s)
        elif kind == "copy":
            copies[i] = (b.kernel(s), line)
        elif kind == "upload":
            uploads[i] = (b.kernel(s), line)
        elif kind == "read":
            uses.append((b.marker(T.HostAccess, copy=copies[i][0], access="read", op="sum()"), copies[i], line))
        elif kind == "write":
            uses.append((b.marker(T.HostAccess, copy=uploads[i][0], access="write", op="fill_()", role="source"),
                         uploads[i], line))
        elif kind == "wait":
            b.wait_stream(s, STREAMS[1 - STREAMS.index(s)])
        elif kind == "sync-stream":
            b.sync("stream", stream=s)
        elif kind == "sync-device":
            b.sync("device")
        elif kind == "event":
            b.record("ev", s)
            b.sync("event", event="ev")
        elif kind == "item":
            b.kernel(s)
            b.sync("read", stream=s)
    sched = Schedules(b.trace)
    return {(copy_line, line) for seq, (copy, copy_line), line in uses if sched.unordered(copy, seq)}


def found(trace: T.Trace, start: int) -> set:
    """Host races in the records from ``start`` on (renumbered, each access naming its copy anew)."""
    sub = renumbered(trace, start)
    sub.records = [dataclasses.replace(r, copy=r.copy - start) if type(r) is T.HostAccess else r
                   for r in sub.records]
    return {tuple(int(w.rsplit(":", 1)[1]) for w in h.where) for h in host_races.find(sub)}


@pytest.mark.npu_allow("race")
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=programs())
def test_host_reads_of_copies_agree_with_brute_force(npugraph, program):
    import torch

    text = source(program)
    note(text)
    side = torch.npu.Stream()
    space = {"torch": torch, "main": torch.npu.current_stream(), "s1": side, "outs": []}
    exec("A = torch.rand(4, 8, device='npu')", space)
    torch.npu.synchronize()
    start = len(npugraph.trace)
    exec(compile(text, "<string>", "exec"), space)
    torch.npu.synchronize()
    assert found(npugraph.trace, start) == expected(program)
