"""Per-test timelines written by the plugin: ``--npu-trace-dir DIR`` (one Chrome-trace JSON per test
that used the NPU, named from its nodeid) and ``--npu-html PATH`` (one self-contained page for the
session).

Works under pytest-xdist: workers write their trace files themselves and hand each test's timeline
to the controller in ``report.user_properties``; only the controller writes the HTML page.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time

import pytest

from .timeline import chrome_trace, task_count

PROPERTY = "npugraph_timeline"
HTML_MAX_TASKS = 3000      # device tasks per test drawn in the HTML page (trace files keep all)


def file_name(nodeid: str) -> str:
    """A readable, filesystem-safe file name for a test: ``tests/a.py::test_b[x]`` ->
    ``tests_a.py__test_b_x.json`` (long ids, and ids with other characters, get a short hash)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.replace("::", "__")).strip("_.") or "test"
    if len(stem) > 120 or re.search(r"[^A-Za-z0-9_./:\[\]-]", nodeid):
        digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
        stem = f"{stem[:120]}-{digest}"
    return stem + ".json"


class Export:
    """Registered as a plugin when ``--npu-trace-dir`` or ``--npu-html`` is given."""

    def __init__(self, config, trace_dir, html_path, header: str):
        self.config = config
        self.trace_dir = os.path.abspath(trace_dir) if trace_dir else None
        self.html_path = os.path.abspath(html_path) if html_path else None
        self.header = header
        self.worker = hasattr(config, "workerinput")
        self.tests: dict = {}          # nodeid -> entry (controller side)
        self.started = time.time()
        if self.trace_dir:
            os.makedirs(self.trace_dir, exist_ok=True)

    # ---------------------------------------------------------------- test side
    def capture(self, item, trace, hazards, status: dict):
        """At the end of a test body: write its trace file and attach its timeline for the page.
        Returns the trace file's path (or None)."""
        tasks = task_count(trace)
        if not tasks:
            return None                              # nothing ran on a device
        long = bool(self.html_path) and tasks > HTML_MAX_TASKS
        data = chrome_trace(trace, hazards, status) if self.trace_dir or not long else None
        path = None
        if self.trace_dir:
            path = os.path.join(self.trace_dir, file_name(item.nodeid))
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f)
        if self.html_path:
            view = chrome_trace(trace, hazards, status, max_tasks=HTML_MAX_TASKS) if long else data
            item.user_properties.append((PROPERTY, json.dumps(view, separators=(",", ":"))))
        return path

    # ---------------------------------------------------------- controller side
    def pytest_runtest_logreport(self, report):
        entry = self.tests.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed",
                                                      "duration": 0.0, "timeline": None})
        entry["duration"] += getattr(report, "duration", 0.0)
        if report.when == "call" or report.outcome != "passed":
            entry["outcome"] = _outcome(report)
        for name, value in report.user_properties:
            if name == PROPERTY:
                entry["timeline"] = value

    def pytest_sessionfinish(self, session):
        if self.worker or not self.html_path:
            return
        from .html import render

        directory = os.path.dirname(self.html_path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(self.html_path, "w", encoding="utf-8") as f:
            f.write(render(list(self.tests.values()), self.header, time.time() - self.started))

    @pytest.hookimpl(trylast=True)        # after the hazard table
    def pytest_terminal_summary(self, terminalreporter):
        if self.trace_dir:
            count = sum(name.endswith(".json") for name in os.listdir(self.trace_dir))
            terminalreporter.write_line(f"npugraph: Chrome traces in {self.trace_dir} ({count} files; open them in "
                                        "Perfetto or chrome://tracing)")
        if self.html_path:
            terminalreporter.write_line(f"npugraph: HTML report {self.html_path}")


def _outcome(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed else "xfailed"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome
