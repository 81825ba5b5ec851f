"""Multi-rank verdicts do not depend on how the rank threads interleave (harness.py).

Why: the ranks are threads the OS schedules as it likes; a verdict (hazards, values, a hang) that
changes between runs of the same test is as serious as a wrong one.  CI runs every multi-rank test
and example once unskewed and ``NPUGRAPH_DETERMINISM_RUNS`` (default 2) times skewed;
``tools/determinism.py`` runs 20.
"""
import os

from . import harness

RUNS = int(os.environ.get("NPUGRAPH_DETERMINISM_RUNS", "2"))


def test_the_harness_finds_the_multi_rank_tests():
    files = harness.targets()
    assert "tests/distributed/test_collectives.py" in files and "examples/test_seed000_core_deadlock.py" in files
    assert not any(f.startswith("tests/determinism") for f in files)


def test_differences_names_the_test_the_run_and_the_field():
    base = {"t": {"outcome": [["call", "passed"]], "hazards": [["race", "failed", "x"]]}}
    other = {"t": {"outcome": [["call", "passed"]], "hazards": []}}
    assert [d[:3] for d in harness.differences([base, base, other])] == [("t", 2, ["hazards"])]


def test_every_multi_rank_verdict_is_the_same_under_rank_skews():
    runs = [harness.run(seed, harness.targets()) for seed in [None, *range(1, RUNS + 1)]]
    assert runs[0], "no multi-rank test ran"
    diffs = harness.differences(runs, skip=harness.known_flaky(runs))
    assert not diffs, harness.report(runs, diffs)
