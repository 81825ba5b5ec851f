"""HCCL op expansion modes: where a collective is orchestrated, hence which cores it holds.

Why: whether two collectives on two streams can starve each other (and a NonZero) of vector
cores depends on HCCL's expansion mode, not on the collective as such.  ``HCCL_OP_EXPANSION_MODE``
(CANN env var reference) takes ``HOST`` (orchestrated on the host CPU, executed by the device's
task scheduler and DMA engines: no AI Core, no Vector Core), ``HOST_TS`` (the same for our
purpose), ``AI_CPU`` (orchestrated on the device's AI CPU: core limits do not apply, no vector
core) and ``AIV`` (orchestrated *and executed* on Vector Cores, holding them until its peers
arrive).  The default depends on the product: ``HOST`` on Atlas A2 (Ascend910B*), ``AI_CPU`` on
Atlas A3 (Ascend910_93*).  ``AIV`` applies only to the collectives the emulated CANN release
documents for the chip family (``cann.py``: on 8.5.0, A2 Broadcast, AllReduce, AlltoAll(V/VC),
AllGather, ReduceScatter and their V forms; A3 Broadcast, AllReduce, ReduceScatter, AllGather,
AlltoAll(V/VC)); other collectives keep the default mode; an unsupported value falls back to the
default.  An AIV collective honours its stream's vector core limit (it runs on the vector cores
the limit leaves it); from CANN 9.0.0 HCCL refuses a limit below the algorithm's minimum.

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

from .. import cann as _cann

ENV = "HCCL_OP_EXPANSION_MODE"
CONFIG_KEY = "hccl_op_expansion_mode"
MODES = ("HOST", "HOST_TS", "AI_CPU", "AIV")
CONFIG_MODES = {1: "HOST", 2: "AI_CPU", 3: "AIV"}       # HcclCommConfig.hcclOpExpansionMode; 0 = default

# the profile of a collective in each mode (collectives.op_cores turns it into OpCores)
# (an HCCL op in every mode: orchestrated on the host or the AI CPU it takes no AI core, and a core
# limit on its stream does not reach it; in AIV mode it runs on the vector cores the limit leaves)
PROFILES = {
    "HOST": {"kind": "HCCL", "vector": 0, "cube": 0, "limit_applies": False},
    "HOST_TS": {"kind": "HCCL", "vector": 0, "cube": 0, "limit_applies": False},
    "AI_CPU": {"kind": "HCCL", "vector": 0, "cube": 0, "limit_applies": False},
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


def effective_mode(kind: str, mode: str, chip_name: str, cann: Optional[_cann.Cann] = None) -> str:
    """The mode collective ``kind`` ("all_reduce", ...) runs in on a communicator of ``mode``: AIV
    only for the collectives the CANN release covers on the chip's family, else the default."""
    if mode == "AIV" and kind not in (cann or _cann.current()).aiv_ops[family(chip_name)]:
        return default_mode(chip_name)
    return mode


def profile(kind: str, mode: str, chip_name: str, cann: Optional[_cann.Cann] = None) -> dict:
    """The core profile of collective ``kind`` in ``mode`` on ``chip_name``."""
    return PROFILES[effective_mode(kind, mode, chip_name, cann)]


def check_limit(kind: str, mode: str, chip_name: str, vector_limit: Optional[int], ranks: int) -> None:
    """Raise HCCL's error when an AIV collective runs under a vector core limit below its
    algorithm's minimum on a CANN release that refuses one (cann.py: 9.0.0)."""
    release = _cann.current()
    if not vector_limit or effective_mode(kind, mode, chip_name, release) != "AIV":
        return
    minimum = release.aiv_minimum(kind, ranks)
    if vector_limit < minimum:
        raise RuntimeError(
            f"HCCL {kind} in AIV mode: the stream's vector core limit {vector_limit} is below the {minimum} vector "
            f"cores its algorithm needs for {ranks} ranks (CANN {release.version}: HCCL refuses a core limit the "
            f"AIV algorithm cannot run in and reports the minimum). Raise the limit to at least {minimum} "
            f"(torch.npu.set_stream_limit / torchair.scope.limit_core_num).")


class HcclAivWarning(UserWarning):
    """A use of HCCL's AIV mode its documentation says is unsupported (several communicators)."""


def launch(job, comm, kind: str, stream) -> None:
    """What HCCL checks when a collective of ``comm`` (in ``comm.mode``) is launched on ``stream``:
    a core limit below the AIV algorithm's minimum is refused (check_limit); the first collective of
    a second communicator in AIV mode warns once per job about HCCL's one-AIV-communicator rule.
    The warning depends on each rank's program order only, never on how the rank threads interleave."""
    runtime = job.runtime
    device = runtime.devices[stream.device]
    chip = device.profile.name
    check_limit(kind, comm.mode, chip, device.explicit_limits(stream)[1], len(comm.members))
    if effective_mode(kind, comm.mode, chip) != "AIV":
        return
    with runtime.lock:
        seen = runtime.extensions.setdefault("hccl_modes.aiv", {})   # (job, device) -> its AIV communicators
        names = seen.setdefault((job.label, stream.device), [])
        if comm.name in names:
            return
        names.append(comm.name)
        if len(names) != 2:
            return
        warned = runtime.extensions.setdefault("hccl_modes.aiv_warned", set())
        if tuple(names) in warned:
            return
        warned.add(tuple(names))
    import warnings

    warnings.warn(HcclAivWarning(
        f"communicators {names[0]!r} and {names[1]!r} both run collectives in AIV mode ({kind} on "
        f"{names[1]!r}): {_cann.AIV_RESTRICTION}"), stacklevel=4)
