"""Rank thread skews (runtime/skew.py): seeded delays at op boundaries, only when asked for.

Why: ``--npu-schedule=shuffle`` and the determinism harness reorder how the rank threads interleave
by a seed; without one, the op path is untouched (no per-op cost), and with one every rank's delays
are a fixed sequence of the seed, so a seed can be named and rerun.
"""
import itertools

import pytest
import torch
import torch.distributed as dist

from pytest_npugraph.runtime import skew
from pytest_npugraph.trace import Kernel

pytestmark = pytest.mark.npu_devices(2)


def test_delays_are_a_sequence_of_seed_and_rank():
    first = list(itertools.islice(skew.delays(3, 0), 200))
    assert first == list(itertools.islice(skew.delays(3, 0), 200))
    assert first != list(itertools.islice(skew.delays(3, 1), 200))
    assert first != list(itertools.islice(skew.delays(4, 0), 200))
    assert 0 < sum(1 for d in first if d) < 200 and max(first) <= skew.LONG


def test_program_schedule_installs_nothing(npugraph):
    assert "kernel_now" not in vars(npugraph.runtime)


def test_installed_skews_delay_every_rank_and_change_no_value(npugraph, monkeypatch):
    slept = []
    monkeypatch.setattr(skew.time, "sleep", lambda s: slept.append(s))
    skew.install(npugraph.runtime, 11)

    def rank_fn(rank):
        t = torch.ones(8, device="npu") * (rank + 1)
        for _ in range(20):
            t = t + 1
        dist.all_reduce(t)
        return t.cpu().tolist()

    assert npugraph.run_ranks(rank_fn) == [[43.0] * 8] * 2
    ops = [sum(1 for k in npugraph.trace.records if isinstance(k, Kernel) and npugraph.trace.streams[k.stream].device == r)
           for r in (0, 1)]
    expected = [d for rank in (0, 1) for d in itertools.islice(skew.delays(11, rank), ops[rank]) if d]
    assert sorted(slept) == sorted(expected) and slept
