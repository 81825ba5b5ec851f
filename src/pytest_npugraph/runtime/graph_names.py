"""The names reports give graphs: the user's, never the emulator's counters.

Why: a hazard in ``npu:0/graph_1:tag '1'`` or in ``NPUGraph#3`` sends the user hunting for which of
their graphs that is.  One scheme for every mode, used by the text reports, the HTML report and the
timelines alike (they all read the names from the trace):

* a compiled graph (TorchAir GE, reduce-overhead, npugraph_ex) is named after the function Dynamo
  compiled: ``torch.compile(decode_step)`` -> ``decode_step``, a module -> ``Model.forward``, a
  lambda -> ``lambda@test_x.py:12`` (its line); the part of a function after a graph break keeps
  the function's name;
* a ``torch.npu.NPUGraph`` capture is named after the line that began it, the
  ``with torch.npu.graph(...)`` line (or ``capture_begin()``, ``make_graphed_callables``):
  ``NPUGraph@test_x.py:12``;
* a second graph of the same name in a test (a graph break, a recompile, the backward graph, a
  capture in a loop) gets ``#2``, ``#3``: ``decode_step#2``; a capture in an ``npugraph.run_ranks``
  thread says its rank (``NPUGraph@test_x.py:12 of rank 1``);
* a reduce-overhead graph key is shown only when it says something (``decode_step[[4]]`` for the
  key of input shape ``[4]``); TorchAir's ``no_updated_input`` and parameter-address hash are not
  (``trace.GraphCall.label``).

TorchAir's own names (``graph_1``, the key with its hash) stay where TorchAir shows them: graph
dumps, ``torch._dynamo`` counters, ``npugraph.graphs[i].name``.
"""
from __future__ import annotations

import re
import sys
import types
from typing import Optional

from ..trace import UNKNOWN_SITE
from .callsite import _display

_RESUME = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_\d+$")


def compiled_function(gm=None) -> Optional[str]:
    """The user's name for the function Dynamo is compiling now (call it from the backend, while Dynamo
    compiles): the code object of Dynamo's ``_compile`` frame, else the outermost frame of the
    graph's first stack trace; None when neither is found (a graph built without Dynamo)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_compile" and frame.f_globals.get("__name__") == "torch._dynamo.convert_frame":
            code = frame.f_locals.get("code")
            if isinstance(code, types.CodeType):
                return _code_name(code)
        frame = frame.f_back
    return _stack_trace_name(gm)


def _code_name(code) -> str:
    qualname = getattr(code, "co_qualname", code.co_name).rpartition("<locals>.")[2]
    head, _, last = qualname.rpartition(".")
    resumed = _RESUME.match(last)
    if resumed:                              # the part after a graph break: the function it is part of
        last = resumed.group(1)
    if last == "<lambda>":
        shown = _display(code.co_filename)
        return f"lambda@{shown}:{code.co_firstlineno}" if shown else "lambda"
    return f"{head}.{last}" if head else last


def _stack_trace_name(gm) -> Optional[str]:
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
        found = re.search(r'line \d+, in (\S+)', trace or "")
        if found:
            resumed = _RESUME.match(found.group(1))
            return resumed.group(1) if resumed else found.group(1)
    return None


def unique(rt, name: str, rank=None) -> str:
    """``name`` the first time in this test (on this rank), then ``name#2``, ``name#3``; a rank's
    names end ``of rank N``."""
    seen = rt.extensions.setdefault("graph_names.seen", {})
    n = seen[rank, name] = seen.get((rank, name), 0) + 1
    return (name if n == 1 else f"{name}#{n}") + ("" if rank is None else f" of rank {rank}")


def compiled(rt, function: Optional[str], torchair_name: str) -> str:
    """The report name of a compiled graph TorchAir calls ``torchair_name`` (``graph_1``)."""
    return unique(rt, function or torchair_name)


def captured(rt, site) -> str:
    """The report name of a ``torch.npu.NPUGraph`` capture begun at ``site``; in an
    ``npugraph.run_ranks`` thread ``... of rank 1``, numbered per rank: each rank captures its own
    graphs, and a count shared by the ranks' threads would follow their timing."""
    name = "NPUGraph" if site is None or site == UNKNOWN_SITE else f"NPUGraph@{site}"
    rank = rt.thread().rank
    return unique(rt, name, None if rank is None else rank[1])

