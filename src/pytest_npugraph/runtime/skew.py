"""Skews of the ``run_ranks`` host threads: seeded delays at op boundaries, so ranks interleave otherwise.

Why: a multi-rank verdict must not depend on how the OS happens to schedule the rank threads (on
hardware each rank is its own process, and any interleaving of their host code is possible).  With a
skew seed (``--npu-schedule=shuffle`` uses its shuffle seed; the determinism harness in
``tests/determinism`` its own), every op a rank thread issues may first sleep a little; the delays of
rank r are a fixed sequence of the seed and r, so a seed names one family of interleavings.  Without
a seed nothing is installed: the per-op path is the class's method, untouched.
"""
from __future__ import annotations

import random
import time

P_SHORT, SHORT = 0.25, 0.002      # a quarter of the ops sleep up to 2 ms (less than a GIL switch interval)
P_LONG, LONG = 0.02, 0.03         # a few sleep up to 30 ms (another rank runs several ops meanwhile)


def delays(seed: int, rank: int):
    """Rank ``rank``'s delay before each op it issues (seconds, mostly 0): a fixed sequence of the seed."""
    rng = random.Random(f"{seed}/{rank}")
    while True:
        draw = rng.random()
        yield (rng.uniform(0, LONG) if draw < P_LONG else
               rng.uniform(0, SHORT) if draw < P_LONG + P_SHORT else 0.0)


def install(runtime, seed: int) -> None:
    """Make ``runtime``'s op boundary (``kernel_now``) delay rank threads by ``seed``'s sequences."""
    original = runtime.kernel_now
    sequences: dict = {}

    def kernel_now(*args, **kwargs):
        bound = runtime.thread().rank
        if bound is not None:
            rank = bound[1]
            sequence = sequences.get(rank)
            if sequence is None:
                sequence = sequences[rank] = delays(seed, rank)
            delay = next(sequence)
            if delay:
                time.sleep(delay)
        return original(*args, **kwargs)

    runtime.kernel_now = kernel_now
