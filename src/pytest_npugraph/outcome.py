"""From hazards to pytest outcomes: fail, warn or record; report sections; the session summary.

Analyses run on the test's trace when the test body has finished (and whenever the
``npugraph`` fixture asks); hazards absorbed by ``npugraph.expect`` or allowed by ``npu_allow``
do not fail the test.  Findings travel in ``report.user_properties`` so the summary also
works under pytest-xdist.
"""
from __future__ import annotations

import sys
import warnings
from collections import Counter, defaultdict

import pytest

from ._context import CONTEXT
from .hazard import KINDS, Hazard, NpuHazardWarning

PROPERTY = "npugraph_hazards"
_STASH = pytest.StashKey()


class TestHazards:
    """The hazards of one test: analysis results (cached per trace length) and what was absorbed."""

    def __init__(self):
        self.absorbed: set = set()
        self.error = None           # the AnalysisError of the latest analysis, if an analysis raised
        self._cache = (-1, [])

    def analyze(self) -> list:
        from .inherit import absorb

        absorb()         # the traces of the test's child processes join its own
        rt = _runtime()
        if rt is None:
            return []
        n = len(rt.trace)
        if self._cache[0] != n:
            from .analysis import AnalysisError, analyze

            # the records as of now: a garbage collection during the analyses may free the test's tensors
            # and append Free records to the live trace (the analyses size their tables once)
            trace = rt.trace.with_records(rt.trace.records[:n])
            try:
                found, self.error = analyze(trace), None
            except AnalysisError as exc:     # the other analyses' hazards still count; check() fails loudly
                found, self.error = exc.hazards, exc
            self._cache = (n, _unique(found))
        return self._cache[1]

    def open(self) -> list:
        return [h for h in self.analyze() if h.key not in self.absorbed]


def _runtime():
    """The running test's emulated runtime, or None if it has not touched the NPU (no torch import)."""
    module = sys.modules.get("pytest_npugraph.runtime.runtime")
    return module.peek() if module is not None else None


def _unique(hazards) -> list:
    seen, out = set(), []
    for h in hazards:
        if h.key not in seen:
            seen.add(h.key)
            out.append(h)
    return out


def hazards_of(item) -> TestHazards:
    state = item.stash.get(_STASH, None)
    if state is None:
        state = item.stash[_STASH] = TestHazards()
    return state


def format_report(hazards) -> str:
    lines = [f"npugraph found {len(hazards)} hazard(s):"]
    for i, h in enumerate(hazards, 1):
        lines.append(f"\n--- {i}. {h.kind} ---\n{h.message}")
    return "\n".join(lines)


class HazardOutcome:
    """Registered as a plugin: turns each test's hazards into its outcome and the summary."""

    def __init__(self, config, chip: str, mode: str):
        self.config = config
        self.chip = chip
        self.mode = mode
        self.summary = defaultdict(Counter)   # kind -> Counter(status)
        self.tests = defaultdict(set)         # kind -> nodeids
        self.export = None                    # report.export.Export with --npu-trace-dir / --npu-html

    def check(self, item, failed: bool = False) -> None:
        state = hazards_of(item)
        found = state.analyze()
        allow = CONTEXT.config.allow
        status = {h.key: self.status_of(h, state, allow) for h in found}
        timeline = self._export(item, found, status)
        if state.error is not None:
            self._analysis_failed(item, state, found, status, failed)
            return
        if not found:
            if timeline:
                item.add_report_section("call", "npugraph timeline", timeline)
            return
        for h in found:
            item.ihook.pytest_npugraph_hazard(item=item, hazard=h)
        failing, listed = [], []
        for h in found:
            listed.append((h.kind, status[h.key], h.message))
            if status[h.key] == "failed":
                failing.append(h)
            elif status[h.key] == "warning":
                warnings.warn(NpuHazardWarning(f"[{h.kind}] {h.message}"))
        item.user_properties.append((PROPERTY, listed))
        where = f"\n\ntimeline: {timeline}" if timeline else ""
        if failing and not failed:
            pytest.fail(format_report(failing) + where, pytrace=False)
        shown = [h for h in found if h.key not in state.absorbed]
        if shown:
            item.add_report_section("call", "npugraph hazards", format_report(shown) + where)

    def _analysis_failed(self, item, state, found, status, failed) -> None:
        """An analysis raised: fail the test with its traceback, and with every hazard the others found."""
        item.user_properties.append((PROPERTY, [(h.kind, status[h.key], h.message) for h in found]))
        shown = [h for h in found if h.key not in state.absorbed]
        text = str(state.error) + ("\n\n" + format_report(shown) if shown else "")
        if failed:
            item.add_report_section("call", "npugraph analysis error", text)
            return
        pytest.fail(text, pytrace=False)

    def status_of(self, h: Hazard, state: TestHazards, allow) -> str:
        return ("expected" if h.key in state.absorbed else
                "allowed" if h.kind in allow else
                "warning" if h.severity == "warning" or self.mode == "warn" else
                "recorded" if self.mode == "off" else "failed")

    def _export(self, item, found: list, status: dict):
        """Hand the test's timeline to ``--npu-trace-dir`` / ``--npu-html``; the trace file's path."""
        rt = _runtime() if self.export is not None else None
        return None if rt is None else self.export.capture(item, rt.trace, found, status)

    # ----------------------------------------------------------------- summary
    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                for kind, status, _ in value:
                    self.summary[kind][status] += 1
                    self.tests[kind].add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.summary:
            return
        tr = terminalreporter
        tr.write_sep("=", "npugraph hazards by kind")
        statuses = ("failed", "expected", "allowed", "warning", "recorded")
        tr.write_line(f"{'kind':<24}" + "".join(f"{s:>10}" for s in statuses) + "   tests")
        total = Counter()
        for kind in sorted(self.summary):
            counts = self.summary[kind]
            total.update(counts)
            tests = sorted(self.tests[kind])
            shown = ", ".join(t.split("::")[-1] for t in tests[:3]) + (f" (+{len(tests) - 3})" if len(tests) > 3 else "")
            line = f"{kind:<24}" + "".join(f"{counts[s]:>10}" for s in statuses) + f"   {shown}"
            tr.write_line(line, red=counts["failed"] > 0, green=not counts["failed"] and counts["expected"] > 0)
        tests = set().union(*self.tests.values())
        tr.write_line(f"{'total':<24}" + "".join(f"{total[s]:>10}" for s in statuses) + f"   {len(tests)} test(s)",
                      bold=True)
        unseen = [k for k in KINDS if k not in self.summary]
        if unseen:
            tr.write_line(f"kinds not found in this run: {', '.join(unseen)}")


__all__ = ["Hazard", "HazardOutcome", "hazards_of", "format_report"]
