"""--npu-schedule=shuffle: work of different streams runs in another legal order, by seed.

Why: a racy test's own numeric assertions always pass in issue order; under shuffle they fail on
racy code (for some seed) and keep passing on correct code (for every seed).
"""
import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

PAIR = """
import torch, torch_npu

def layer(synchronized):
    main, side = torch.npu.current_stream(), torch.npu.Stream()
    x = torch.arange(64.0, device="npu").reshape(8, 8)
    h = x * 2 + 1                                   # produced on main
    if synchronized:
        side.wait_stream(main)
    with torch.npu.stream(side):
        shared = h @ h.T                            # read on the side stream
    if synchronized:
        main.wait_stream(side)
    return (shared + h).cpu()

def reference():
    x = torch.arange(64.0).reshape(8, 8)
    h = x * 2 + 1
    return h @ h.T + h

def test_racy_numbers(npugraph):
    with npugraph.expect("race"):
        out = layer(synchronized=False)
    torch.testing.assert_close(out, reference())

def test_correct_numbers(npugraph):
    torch.testing.assert_close(layer(synchronized=True), reference())
    npugraph.assert_clean()
"""


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:randomly", *args)


def test_program_schedule_is_the_default_and_both_pass(pytester):
    pytester.makepyfile(test_pair=PAIR)
    result = run(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["npugraph: schedule program"])


def test_shuffle_fails_the_racy_numbers_for_some_seed_and_never_the_correct_ones(pytester):
    pytester.makepyfile(test_pair=PAIR)
    racy_failed = 0
    for seed in range(4):
        result = run(pytester, "--npu-schedule=shuffle", f"--npu-schedule-seed={seed}")
        result.stdout.fnmatch_lines([f"npugraph: schedule shuffle (--npu-schedule-seed={seed})"])
        outcomes = result.parseoutcomes()
        assert "test_correct_numbers PASSED" in result.stdout.str() or outcomes.get("failed", 0) <= 1
        assert not re.search(r"FAILED .*test_correct_numbers", result.stdout.str()), result.stdout.str()
        racy_failed += bool(re.search(r"FAILED .*test_racy_numbers", result.stdout.str()))
    assert racy_failed >= 2


def test_a_seed_reproduces_its_schedule(pytester):
    pytester.makepyfile(test_pair=PAIR)
    first = run(pytester, "--npu-schedule=shuffle", "--npu-schedule-seed=3").parseoutcomes()
    again = run(pytester, "--npu-schedule=shuffle", "--npu-schedule-seed=3").parseoutcomes()
    assert first == again


def test_ini_mirrors_and_a_random_seed_in_the_header(pytester):
    pytester.makepyfile(test_pair=PAIR)
    pytester.makeini("[pytest]\nnpu_schedule = shuffle\n")
    result = run(pytester, "-k", "correct")
    result.stdout.re_match_lines([r"npugraph: schedule shuffle \(--npu-schedule-seed=\d+\)"])
    result.assert_outcomes(passed=1, deselected=1)
    pytester.makeini("[pytest]\nnpu_schedule = sometimes\n")
    run(pytester).stderr.fnmatch_lines(["*npu_schedule must be one of program, shuffle*"])


def test_the_examples_race_variants_under_shuffle(pytester):
    """The shared-expert example: its fixed variant gives the reference numbers under every seed."""
    pytester.syspathinsert(EXAMPLES)
    pytester.makeconftest((EXAMPLES / "conftest.py").read_text())
    pytester.makepyfile(test_race=(EXAMPLES / "test_race_shared_expert.py").read_text())
    for seed in range(2):
        result = run(pytester, "--npu-schedule=shuffle", f"--npu-schedule-seed={seed}", "-k", "fork_and_join")
        result.assert_outcomes(passed=1, deselected=result.parseoutcomes().get("deselected", 0))


def test_the_examples_racy_variant_fails_its_numbers_under_shuffle(pytester):
    pytester.syspathinsert(EXAMPLES)
    pytester.makeconftest((EXAMPLES / "conftest.py").read_text())
    pytester.makepyfile(test_race=(EXAMPLES / "test_race_shared_expert.py").read_text())
    assert run(pytester, "-k", "numbers").parseoutcomes().get("passed") == 1        # issue order: passes
    failed = sum(run(pytester, "--npu-schedule=shuffle", f"--npu-schedule-seed={seed}", "-k", "numbers")
                 .parseoutcomes().get("failed", 0) for seed in range(4))
    assert failed >= 1


RANKS = """
import pytest, torch, torch.distributed as dist
from pytest_npugraph.runtime import skew

@pytest.mark.npu_devices(2)
def test_ranks(npugraph, monkeypatch):
    slept = []
    monkeypatch.setattr(skew.time, "sleep", slept.append)
    def rank_fn(rank):
        t = torch.ones(4, device="npu") * (rank + 1)
        for _ in range(30):
            t = t + 1
        dist.all_reduce(t)
        return t.cpu().tolist()
    assert npugraph.run_ranks(rank_fn) == [[63.0] * 4] * 2
    print("SKEWED", "kernel_now" in vars(npugraph.runtime), bool(slept))
"""


def test_shuffle_also_skews_the_rank_threads_by_its_seed(pytester):
    """The shuffle's seed decides the run_ranks threads' delays at op boundaries (runtime/skew.py)."""
    pytester.makepyfile(test_ranks=RANKS)
    result = run(pytester, "-s", "--npu-schedule=shuffle", "--npu-schedule-seed=5")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*SKEWED True True*"])
    result = run(pytester, "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*SKEWED False False*"])
