"""Scenarios the core and deadlock tests share, built with the analysis tests' trace builder."""
from __future__ import annotations

from analysis.tracebuild import Build


def seed(nonzero_limit: int = 0) -> Build:
    """Seed 000: two cards with 48 vector cores; reduce-scatter (16) and dispatch/combine
    (24) on their own streams, NonZero (all 48 at once) on a third, all concurrent.
    ``nonzero_limit`` limits NonZero's stream (the seed's fix is 8 = 48 - 16 - 24)."""
    b = Build(devices=2)
    for device in range(2):
        rs, ep, nz = (b.stream(name, device) for name in ("hccl", "moe", "compute"))
        b.collective(rs, "reduce_scatter", "tp", 0, vector=16)
        b.collective(ep, "dispatch_combine", "ep", 0, vector=24, kind="MC2")
        if nonzero_limit:
            b.limit(nz, vector=nonzero_limit)
        b.kernel(nz, op="nonzero", vector=48, resident=True)
    return b
