"""Issue 24's must-show figures for multi-rank runs, re-runnable on any checkout.

    python tools/multirank_figures.py                      # all three, default counts
    python tools/multirank_figures.py late seed            # only some of them
    python tools/multirank_figures.py --load 2 seed        # with 2 busy processes beside the runs
    python tools/multirank_figures.py --harness-runs 5 determinism

* ``late``: the late-rank program (rank 1 sleeps 0.3 s, then ``torch.tensor([0, 1], device="npu")``,
  then ``all_reduce``; tests/distributed/test_late_rank.py) run --late-runs times (50) in one pytest.
* ``seed``: the seed-000 scenario with two communicators (tests/distributed/
  test_seed_two_communicators.py, the deadlock and its fix) run --seed-runs times (20) each, under
  ``-n 2`` and under ``-n 0``: every run must give the test's verdict (it passes).
* ``determinism``: tools/determinism.py's harness (every multi-rank test and example, one unskewed
  run and --harness-runs skewed ones): tests x runs and verdict changes (must be 0).

A figure's repeats are one pytest run whose tests are parametrized ``run0..runN`` by this file acting
as a pytest plugin (``-p multirank_figures``).  The load average is printed with each figure (the
runs are meant to be measured on a loaded machine; ``--load N`` adds N busy processes).  Exit 1 if
any figure falls short.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
_REPEAT = int(os.environ.get("NPUGRAPH_FIGURES_REPEAT", "0"))

LATE = "tests/distributed/test_late_rank.py"
SEED = "tests/distributed/test_seed_two_communicators.py"


# ------------------------------------------------------------------ the pytest plugin side
if _REPEAT:
    import pytest

    @pytest.fixture
    def _figures_repeat(request):
        return request.param

    def pytest_generate_tests(metafunc):
        metafunc.fixturenames.append("_figures_repeat")
        metafunc.parametrize("_figures_repeat", range(_REPEAT), indirect=True, ids=lambda i: f"run{i}")


# ------------------------------------------------------------------ the command side
def _busy() -> None:
    while True:
        pass


def _repeat(files, runs: int, workers: int) -> dict:
    """One pytest over ``files`` with every test repeated ``runs`` times: test name -> [passed, total]."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, NPUGRAPH_FIGURES_REPEAT=str(runs),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")])))
        cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
               "-p", "multirank_figures", "-n", str(workers), f"--junitxml={xml}"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if not os.path.exists(xml):
            raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}")
        counts: dict = {}
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = re.sub(r"\[\]$", "", re.sub(r"-?\brun\d+\b-?", "", case.get("name")))
            seen = counts.setdefault(name, [0, 0])
            seen[1] += 1
            if not any(child.tag in ("failure", "error", "skipped") for child in case):
                seen[0] += 1
        return counts


def _show(title: str, counts: dict, runs: int, seconds: float) -> bool:
    ok = all(passed == total == runs for passed, total in counts.values()) and bool(counts)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{title}: {'OK' if ok else 'SHORT'} ({seconds:.0f} s, load average {load})")
    for name, (passed, total) in sorted(counts.items()):
        print(f"  {name}: {passed} of {total} passed")
    return ok


def late(args) -> bool:
    start = time.monotonic()
    counts = _repeat([LATE], args.late_runs, 0)
    return _show(f"late rank, {args.late_runs} runs, -n 0", counts, args.late_runs, time.monotonic() - start)


def seed(args) -> bool:
    ok = True
    for workers in (2, 0):
        start = time.monotonic()
        counts = _repeat([SEED], args.seed_runs, workers)
        ok &= _show(f"seed 000 with two communicators, {args.seed_runs} runs, -n {workers}", counts,
                    args.seed_runs, time.monotonic() - start)
    return ok


def determinism(args) -> bool:
    sys.path.insert(0, str(ROOT))
    from tests.determinism import harness

    files = harness.targets()
    start, runs = time.monotonic(), []
    for s in [None, *range(args.first_seed, args.first_seed + args.harness_runs)]:
        runs.append(harness.run(s, files))
        changes = len(harness.differences(runs, skip=harness.known_flaky(runs)))
        print(f"  harness run {len(runs) - 1} (seed {s}): {len(runs[-1])} tests, {changes} verdict changes "
              f"so far, {time.monotonic() - start:.0f} s", flush=True)
    flaky = harness.known_flaky(runs)
    diffs = harness.differences(runs, skip=flaky)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"determinism harness: {len(runs[0])} tests x {len(runs)} runs ({len(files)} files), "
          f"{len(diffs)} verdict changes, {len(flaky)} known flaky ({time.monotonic() - start:.0f} s, "
          f"load average {load})")
    print(harness.report(runs, diffs))
    return not diffs


FIGURES = {"late": late, "seed": seed, "determinism": determinism}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figures", nargs="*", help=f"some of {', '.join(FIGURES)} (default: all)")
    parser.add_argument("--late-runs", type=int, default=50)
    parser.add_argument("--seed-runs", type=int, default=20)
    parser.add_argument("--harness-runs", type=int, default=20, help="skewed runs besides the unskewed one")
    parser.add_argument("--first-seed", type=int, default=1, help="the skew seed of the first skewed run")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    args = parser.parse_args(argv)
    unknown = set(args.figures) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; choose from {', '.join(FIGURES)}")
    import multiprocessing

    burners = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for p in burners:
        p.start()
    try:
        results = [FIGURES[name](args) for name in (args.figures or FIGURES)]
    finally:
        for p in burners:
            p.terminate()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
