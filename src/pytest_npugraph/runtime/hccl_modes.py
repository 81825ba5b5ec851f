"""HCCL op expansion modes: where a collective is orchestrated, hence which cores it holds.

Why: whether two collectives on two streams can starve each other (and a NonZero) of vector
cores depends on HCCL's expansion mode, not on the collective as such.  ``HCCL_OP_EXPANSION_MODE``
(CANN env var reference) takes ``HOST`` (orchestrated on the host CPU, executed by the device's
task scheduler and DMA engines: no AI Core, no Vector Core), ``HOST_TS`` (the same for our
purpose), ``AI_CPU`` (orchestrated on the device's AI CPU: core limits do not apply, no vector
core) and ``AIV`` (orchestrated *and executed* on Vector Cores, holding them until its peers
arrive).  The default depends on the product: ``HOST`` on Atlas A2 (Ascend910B*), ``AI_CPU`` on
Atlas A3 (Ascend910_93*).  ``AIV`` applies only to the collectives HCCL documents for it (A2:
AllReduce and AlltoAll(V); A3: AllReduce, AllGather, ReduceScatter, AlltoAll(V), Broadcast);
other collectives keep the default mode; an unsupported value falls back to the default.

torch_npu also takes the mode per process group: ``ProcessGroupHCCL.Options().hccl_config
["hccl_op_expansion_mode"]`` (an int: 0 default, 1 HOST, 2 AI_CPU, 3 AIV, as HCCL's
``HcclCommConfig.hcclOpExpansionMode``), which wins over the environment for that communicator.
MC2 fused ops (``npu_moe_distribute_dispatch``/``combine``, ...) take the profile of their op spec
(every vector core, in any mode), and a ``pytest_npugraph_op_profile`` hook answer overrides all of
this (see ``collectives.op_cores``).
"""
from __future__ import annotations

import os
from typing import Optional

ENV = "HCCL_OP_EXPANSION_MODE"
CONFIG_KEY = "hccl_op_expansion_mode"
MODES = ("HOST", "HOST_TS", "AI_CPU", "AIV")
CONFIG_MODES = {1: "HOST", 2: "AI_CPU", 3: "AIV"}       # HcclCommConfig.hcclOpExpansionMode; 0 = default

AIV_OPS = {
    "A2": frozenset({"all_reduce", "all_to_all"}),
    "A3": frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}),
}

# the profile of a collective in each mode (collectives.op_cores turns it into OpCores)
PROFILES = {
    "HOST": {"kind": "HCCL", "vector": 0, "cube": 0},
    "HOST_TS": {"kind": "HCCL", "vector": 0, "cube": 0},
    "AI_CPU": {"kind": "AICPU", "vector": 0, "cube": 0, "limit_applies": False},
    "AIV": {"kind": "HCCL", "vector": "all", "all_resident": True},
}


def family(chip_name: str) -> str:
    """``A3`` for the Ascend910_93xx parts, else ``A2`` (the 910B parts)."""
    return "A3" if chip_name.startswith("Ascend910_93") else "A2"


def default_mode(chip_name: str) -> str:
    return "AI_CPU" if family(chip_name) == "A3" else "HOST"


def config_mode(hccl_config: Optional[dict]) -> Optional[str]:
    """The mode a process group's ``hccl_config`` asks for (None: not set, or 0 = default);
    raises torch_npu's error for a value that is not an int."""
    if not hccl_config or CONFIG_KEY not in hccl_config:
        return None
    value = hccl_config[CONFIG_KEY]
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuntimeError("Value type of hccl_op_expansion_mode should be int.")
    return CONFIG_MODES.get(value)


def communicator_mode(chip_name: str, hccl_config: Optional[dict] = None, environ=None) -> str:
    """The mode a new communicator runs its collectives in: the process group option, else the
    environment (read when the communicator is created, as HCCL does), else the chip's default."""
    mode = config_mode(hccl_config)
    if mode is None:
        env = (os.environ if environ is None else environ).get(ENV, "").strip().upper()
        mode = env if env in MODES else None
    return mode or default_mode(chip_name)


def profile(kind: str, mode: str, chip_name: str) -> dict:
    """The core profile of collective ``kind`` ("all_reduce", ...) in ``mode`` on ``chip_name``."""
    if mode == "AIV" and kind not in AIV_OPS[family(chip_name)]:
        mode = default_mode(chip_name)
    return PROFILES[mode]
