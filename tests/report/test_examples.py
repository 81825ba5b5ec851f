"""The examples suite is the README's main job: every hazard kind that has an analysis has an
example that catches it, ``pytest examples`` passes with each of those kinds in its summary, and each
report an example gets fits one screen (issue 27)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from pytest_npugraph.analysis import REGISTRY
from pytest_npugraph.hazard import KINDS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ANALYSED = [k for k in KINDS if any(kinds is None or k in kinds for kinds, _ in REGISTRY)]


def test_every_analysed_kind_has_an_example_expecting_it():
    source = "\n".join(p.read_text() for p in EXAMPLES.glob("test_*.py"))
    expected = set(re.findall(r"""npugraph\.expect\(\s*["']([\w-]+)["']""", source))
    assert set(ANALYSED) <= expected, f"kinds without an example: {sorted(set(ANALYSED) - expected)}"
    assert expected <= set(KINDS)


DUMP = """
import json, os
def pytest_npugraph_hazard(item, hazard):
    with open(os.environ["EXAMPLES_HAZARDS"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": item.nodeid, "kind": hazard.kind, "message": hazard.message}) + "\\n")
"""
SCREEN = (40, 120)     # a report fits one screen: at most 40 lines of 120 columns (docs/reference.md, "Reports")


def run_examples(tmp_path) -> tuple:
    """One run of the examples suite: (the completed process, every hazard it reported)."""
    (tmp_path / "examples_hazards_dump.py").write_text(DUMP, encoding="utf-8")
    out = tmp_path / "hazards.jsonl"
    env = {**os.environ, "EXAMPLES_HAZARDS": str(out), "PYTHONPATH": os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-m", "pytest", str(EXAMPLES), "-q", "-p", "no:randomly",
                          "-p", "no:cacheprovider", "-p", "examples_hazards_dump", "-W", "ignore::DeprecationWarning"],
                         cwd=EXAMPLES.parent, env=env, capture_output=True, text=True, timeout=900)
    reported = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] if out.exists() else []
    return run, reported


def screen_lines(message: str, width: int = SCREEN[1]) -> int:
    """The lines ``message`` takes on a terminal ``width`` columns wide."""
    return sum(max(1, -(-len(line) // width)) for line in message.splitlines())


def test_screen_lines_counts_wrapped_lines():
    assert screen_lines("a" * 120) == 1 and screen_lines("a" * 121) == 2 and screen_lines("x\n\ny") == 3


def test_the_examples_pass_summarise_every_analysed_kind_as_caught_and_report_in_one_screen(tmp_path):
    """One run of the suite (about a minute) for its three checks; the last: every hazard report an
    example gets fits one screen."""
    run, reported = run_examples(tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    table = run.stdout.split("npugraph hazards by kind", 1)[1]
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^([\w-]+) +(\d+) +(\d+) ", table, re.M)}
    for kind in ANALYSED:
        assert rows.get(kind, (0, 0))[1] > 0, f"{kind} not caught by the examples:\n{table}"
        assert rows[kind][0] == 0
    assert {r["kind"] for r in reported} >= set(ANALYSED)            # every kind's report was measured
    too_long = [(r["test"], r["kind"], screen_lines(r["message"])) for r in reported
                if screen_lines(r["message"]) > SCREEN[0]]
    assert too_long == []
