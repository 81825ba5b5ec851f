"""Chip profiles: core counts and memory of the Ascend SoCs the emulator can pretend to be.

Counts are the ``ai_core_cnt``/``vector_core_cnt`` of each SoC's CANN platform file
(``<arch>-linux/data/platform_config/<soc>.ini``); A2 (910B) and A3 (910_93) parts pair one
cube core with two vector cores.  ``npu_cores`` overrides the counts of any profile.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

GiB = 1024 ** 3


@dataclass(frozen=True)
class ChipProfile:
    name: str
    cube_cores: int
    vector_cores: int
    hbm_bytes: int
    l2_cache_bytes: int = 192 * 1024 ** 2

    def with_cores(self, cube: int, vector: int) -> "ChipProfile":
        return replace(self, cube_cores=cube, vector_cores=vector)


CHIPS = {
    p.name: p
    for p in (
        ChipProfile("Ascend910B1", 24, 48, 64 * GiB),
        ChipProfile("Ascend910B2", 24, 48, 64 * GiB),
        ChipProfile("Ascend910B2C", 24, 48, 64 * GiB),
        ChipProfile("Ascend910B3", 20, 40, 64 * GiB),
        ChipProfile("Ascend910B4", 20, 40, 32 * GiB),
        ChipProfile("Ascend910B4-1", 20, 40, 64 * GiB),
        ChipProfile("Ascend910_9391", 24, 48, 64 * GiB),
        ChipProfile("Ascend910_9392", 24, 48, 64 * GiB),
        ChipProfile("Ascend910_9381", 24, 48, 64 * GiB),
        ChipProfile("Ascend910_9382", 24, 48, 64 * GiB),
        ChipProfile("Ascend910_9372", 20, 40, 64 * GiB),
        ChipProfile("Ascend910_9362", 20, 40, 64 * GiB),
    )
}

DEFAULT_CHIP = "Ascend910B1"


def lookup(name: str) -> ChipProfile:
    """The profile called ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return CHIPS[name]
    except KeyError:
        raise KeyError(f"unknown chip {name!r}; known chips: {', '.join(CHIPS)}") from None
