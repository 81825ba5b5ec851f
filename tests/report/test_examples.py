"""The examples suite is the README's main job: every hazard kind that has an analysis has an
example that catches it, and ``pytest examples`` passes with each of those kinds in its summary."""
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


def test_the_examples_pass_and_summarise_every_analysed_kind_as_caught():
    run = subprocess.run([sys.executable, "-m", "pytest", str(EXAMPLES), "-q", "-p", "no:randomly",
                          "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"],
                         cwd=EXAMPLES.parent, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    table = run.stdout.split("npugraph hazards by kind", 1)[1]
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^([\w-]+) +(\d+) +(\d+) ", table, re.M)}
    for kind in ANALYSED:
        assert rows.get(kind, (0, 0))[1] > 0, f"{kind} not caught by the examples:\n{table}"
        assert rows[kind][0] == 0
