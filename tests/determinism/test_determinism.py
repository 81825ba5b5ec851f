"""Multi-rank verdicts do not depend on how the rank threads interleave (harness.py).

Why: the ranks are threads the OS schedules as it likes; a verdict (hazards, values, a hang) that
changes between runs of the same test is as serious as a wrong one.  Each run re-runs the tests it
covers, so CI keeps it small: the seed-000 scenarios, the collectives and the multi-rank examples,
once unskewed and ``NPUGRAPH_DETERMINISM_RUNS`` (default 2) times skewed;
``NPUGRAPH_DETERMINISM_ALL=1`` covers every multi-rank test and example, and
``tools/determinism.py`` runs them all 20 times.
"""
import os

from . import harness

RUNS = int(os.environ.get("NPUGRAPH_DETERMINISM_RUNS", "2"))
CI_FILES = ["tests/distributed/test_seed.py", "tests/distributed/test_cann.py",
            "tests/distributed/test_seed_two_communicators.py", "tests/distributed/test_collectives.py",
            "tests/distributed/test_hazard_order.py", "examples/test_seed000_core_deadlock.py",
            "examples/test_seed000_async_collectives.py"]


def test_the_harness_finds_the_multi_rank_tests():
    files = harness.targets()
    assert "tests/distributed/test_collectives.py" in files and "examples/test_seed000_core_deadlock.py" in files
    assert not any(f.startswith("tests/determinism") for f in files)
    assert set(CI_FILES) <= set(files)


def test_differences_names_the_test_the_run_and_the_field():
    base = {"t": {"outcome": [["call", "passed"]], "hazards": [["race", "failed", "x"]]}}
    other = {"t": {"outcome": [["call", "passed"]], "hazards": []}}
    assert [d[:3] for d in harness.differences([base, base, other])] == [("t", 2, ["hazards"])]


def test_every_multi_rank_verdict_is_the_same_under_rank_skews():
    files = harness.targets() if os.environ.get("NPUGRAPH_DETERMINISM_ALL") else CI_FILES
    runs = [harness.run(seed, files) for seed in [None, *range(1, RUNS + 1)]]
    assert runs[0], "no multi-rank test ran"
    diffs = harness.differences(runs, skip=harness.known_flaky(runs))
    assert not diffs, harness.report(runs, diffs)


INTERLEAVING = '''
import pytest, torch

@pytest.mark.npu_devices(2)
def test_order(npugraph):
    seen = []

    def fn(rank):
        for i in range(60):
            torch.ones(2, device="npu").add_(i)
            seen.append(rank)
        return None

    npugraph.run_ranks(fn)
    npugraph.run_ranks(lambda rank: "".join(map(str, seen)) if rank == 0 else None)
'''


def test_the_harness_catches_a_value_that_depends_on_the_interleaving(tmp_path):
    path = tmp_path / "test_interleaving.py"
    path.write_text(INTERLEAVING)
    runs = [harness.run(seed, [str(path)]) for seed in (None, 1)]
    (nodeid,) = runs[0]
    assert runs[0][nodeid]["outcome"] == [["call", "passed"]]
    assert [d[:3] for d in harness.differences(runs)] == [(nodeid, 1, ["run_ranks"])]
