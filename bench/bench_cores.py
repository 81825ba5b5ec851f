"""Benchmark of the core-limit and deadlock analyses (not a test).

    PYTHONPATH=src python bench/bench_cores.py

Targets: the seed-000 deadlock found in <= 1 s; an 8-device x 4-stream x 200-op pipeline
explored in <= 30 s.  The pipeline is a MoE decoder layer repeated 100 times, two ops per
stream per layer, collectives in the same order on every rank, streams ordered by events:

    compute: quant_matmul ........................................ moe_gating (after all but all_gather)
    tp:          all_reduce (16 AIV, resident) ......... all_gather (16, after combine)
    ep:          dispatch (24 MC2) -> combine (24 MC2)
    aux:         nonzero (48 at once, limited to 8) -> argsort

all_reduce, dispatch and nonzero may overlap: 16 + 24 + 8 = 48, the docs' fix of seed 000.
Variants: ``limited`` (every pool fits: the search never branches); ``contended``
(moe_gating is resident with 40 blocks and may overlap all_gather: 56 > 48, so grabs
compete and the search branches on every device, yet no rank can lose its collective's
cores: deadlock-free); ``deadlock`` (limited, but the last layer's nonzero is unlimited:
seed 000 across 8 ranks).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from analysis.tracebuild import Build  # noqa: E402
from analysis_cores.scenarios import seed  # noqa: E402

from pytest_npugraph.analysis import cores, deadlock  # noqa: E402
from pytest_npugraph.trace import GroupCreated  # noqa: E402


def pipeline(devices: int = 8, layers: int = 100, contended: bool = False, seed_layer: int = -1) -> Build:
    b = Build(devices=devices)
    for group in ("tp", "ep"):
        b.marker(GroupCreated, group=group, devices=tuple(range(devices)))
    lanes = [[b.stream(name, d) for name in ("compute", "tp", "ep", "aux")] for d in range(devices)]
    for layer in range(layers):
        for compute, tp, ep, aux in lanes:
            b.kernel(compute, op="npu_quant_matmul", cube=24)
            for side in (tp, ep, aux):
                b.wait_stream(side, compute)
            b.collective(tp, "all_reduce", "tp", 2 * layer, vector=16)
            b.collective(ep, "moe_distribute_dispatch", "ep", 2 * layer, vector=24, kind="MC2")
            b.collective(ep, "moe_distribute_combine", "ep", 2 * layer + 1, vector=24, kind="MC2")
            limit = 48 if layer == seed_layer else 8
            if b.limits[aux][1] != limit:
                b.limit(aux, vector=limit)
            b.kernel(aux, op="nonzero", vector=48, resident=True)
            b.kernel(aux, op="argsort", vector=48)
            b.wait_stream(tp, ep)
            for side in (tp, ep, aux):
                b.wait_stream(compute, side)
            b.collective(tp, "all_gather", "tp", 2 * layer + 1, vector=16)
            b.kernel(compute, op="moe_gating_top_k", vector=40, resident=contended)
            b.wait_stream(compute, tp)
    return b


def timed(label: str, trace, limit_s: float) -> None:
    """One line: size, states searched, the cost of each analysis as the plugin calls it."""
    clock = time.perf_counter
    start = clock()
    hazards = deadlock.find(trace)
    deadlock_s, start = clock() - start, clock()
    hazards += cores.find(trace)
    cores_s = clock() - start
    result = deadlock.explore(trace)
    kernels = sum(1 for r in trace.records if type(r).__name__ == "Kernel")
    verdict = "deadlock" if result.stuck else ("clean" if result.complete else "budget out")
    print(f"{label:<42} {kernels:>5} kernels {result.states:>6} states  "
          f"deadlock.find {deadlock_s:6.2f} s  cores.find {cores_s:5.2f} s  {verdict:<8} "
          f"{sorted({h.kind for h in hazards})}  "
          f"{'OK' if deadlock_s + cores_s <= limit_s else f'OVER {limit_s} s'}")


def main() -> None:
    timed("seed 000 (2 cards, 48 vector cores)", seed().trace, 1.0)
    timed("seed 000 fixed (NonZero limited to 8)", seed(nonzero_limit=8).trace, 1.0)
    timed("8 dev x 4 streams x 200 ops, limited", pipeline().trace, 30.0)
    timed("8 dev x 4 streams x 200 ops, contended", pipeline(contended=True).trace, 30.0)
    timed("8 dev x 4 streams x 200 ops, deadlock last", pipeline(seed_layer=99).trace, 30.0)


if __name__ == "__main__":
    main()
