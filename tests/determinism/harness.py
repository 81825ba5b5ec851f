"""The determinism harness: every multi-rank test and example, run several times with different rank
thread skews, must give the same verdict each time.

A run is a child pytest (``determinism_recorder`` keeps the tests that call ``npugraph.run_ranks``
and records their verdicts); run 0 has no skew, run k the skew of seed k (runtime/skew.py: seeded
delays of every rank thread at op boundaries).  A verdict is a test's outcome, its hazards (kind,
status, text) and what each ``run_ranks`` call returned or raised (values, or the exception's type
and text, ``DeviceHang`` included): a hang on hardware must stay a hang under every skew, and
anything else must never end in one.  ``tools/determinism.py`` runs it with K = 20.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DURATIONS: dict = {}      # nodeid -> seconds of its latest run (for choosing what CI runs)


def targets(root: Path = ROOT) -> list:
    """Test files of tests/ and examples/ that call run_ranks (this directory's own excluded)."""
    files = sorted(root.glob("tests/**/test_*.py")) + sorted(root.glob("examples/test_*.py"))
    return [str(f.relative_to(root)) for f in files
            if HERE not in f.parents and "run_ranks" in f.read_text(encoding="utf-8")]


def run(seed, files, extra=()) -> dict:
    """One child pytest over ``files`` with the skew of ``seed`` (None: none): nodeid -> verdict."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "verdicts.json")
        env = dict(os.environ, NPUGRAPH_DETERMINISM_OUT=out,
                   NPUGRAPH_DETERMINISM_SEED="" if seed is None else str(seed),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")])))
        cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
               "-p", "determinism_recorder", "-n", "0", *extra]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        parts = sorted(p for p in os.listdir(tmp) if not p.endswith(".durations"))   # one per xdist worker
        if not parts:
            raise RuntimeError(f"the child pytest wrote no verdicts (exit {proc.returncode}):\n"
                               f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        verdicts: dict = {}
        for part in parts:
            with open(os.path.join(tmp, part)) as f:
                verdicts.update(json.load(f))
            with open(os.path.join(tmp, part + ".durations")) as f:
                DURATIONS.update(json.load(f))
        return verdicts


def known_flaky(runs: list) -> set:
    """Tests marked ``xfail(strict=False)`` in some run: known flaky, reported but not counted."""
    return {nodeid for verdicts in runs for nodeid, v in verdicts.items() if "xfail" in v}


def differences(runs: list, skip=frozenset()) -> list:
    """``(nodeid, run index, what differs)`` for every verdict that is not the same as run 0's."""
    base = runs[0]
    found = []
    for k, verdicts in enumerate(runs[1:], 1):
        for nodeid in sorted(set(base) | set(verdicts)):
            if nodeid in skip:
                continue
            a, b = base.get(nodeid), verdicts.get(nodeid)
            if a == b:
                continue
            keys = sorted(set(a or {}) | set(b or {}))
            what = [key for key in keys if (a or {}).get(key) != (b or {}).get(key)]
            found.append((nodeid, k, what, a, b))
    return found


def report(runs: list, diffs: list) -> str:
    tests = len(runs[0])
    calls = sum(len(v.get("run_ranks", [])) for v in runs[0].values())
    lines = [f"{tests} multi-rank tests ({calls} run_ranks calls) x {len(runs)} runs (run 0 unskewed, runs 1.."
             f"{len(runs) - 1} skewed): {len(diffs)} verdict change(s) in "
             f"{len({d[0] for d in diffs})} test(s)"]
    for nodeid in sorted(known_flaky(runs)):
        flaky = [d for d in differences(runs) if d[0] == nodeid]
        fields = sorted({key for d in flaky for key in d[2]})
        reason = next(v[nodeid]["xfail"] for v in runs if "xfail" in v.get(nodeid, {}))
        lines.append(f"  known flaky (xfail, not counted): {nodeid}: {len(flaky)} of {len(runs) - 1} skewed runs "
                     f"differ from run 0 (in {', '.join(fields) or 'nothing'}; xfail: {reason})")
    for nodeid, k, what, a, b in diffs:
        lines.append(f"  {nodeid}: run {k} differs in {', '.join(what)}")
        for key in what:
            lines.append(f"    run 0: {json.dumps((a or {}).get(key))[:600]}")
            lines.append(f"    run {k}: {json.dumps((b or {}).get(key))[:600]}")
    return "\n".join(lines)
