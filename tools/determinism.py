"""Run the determinism harness (tests/determinism/harness.py) with many skewed runs.

    python tools/determinism.py                 # every multi-rank test and example, 1 + 20 runs
    python tools/determinism.py --runs 5 tests/distributed/test_seed_two_communicators.py
    python tools/determinism.py -k seed          # extra pytest arguments after the files

Prints tests x runs and every verdict change (exit 1 if any, known-flaky xfail cases listed apart).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.determinism import harness  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="skewed runs (besides the unskewed run 0)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("files", nargs="*", help="test files (default: every file calling run_ranks)")
    args, extra = parser.parse_known_args(argv)
    files = args.files or harness.targets()
    runs, start = [], time.monotonic()
    for seed in [None, *range(args.first_seed, args.first_seed + args.runs)]:
        runs.append(harness.run(seed, files, extra))
        print(f"run {len(runs) - 1} (seed {seed}): {len(runs[-1])} tests, {time.monotonic() - start:.0f} s",
              flush=True)
    diffs = harness.differences(runs, skip=harness.known_flaky(runs))
    print(harness.report(runs, diffs))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
