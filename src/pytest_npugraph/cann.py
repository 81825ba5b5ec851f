"""The emulated CANN version, and every fact of the emulation that depends on it.

Why: what HCCL does with a collective (which collectives AIV mode covers on each chip family,
whether it refuses a core limit) and whether TorchAir keeps static shape kernels beside a core
limit changed between CANN releases; a suite pins the release it runs on (``--npu-cann``, ini
``npu_cann``, marker ``npu_cann("8.5.0")``) and gets that release's behaviour.  No torch here:
the plugin validates the setting at start-up.

Sources, per release (the ``HCCL_OP_EXPANSION_MODE`` page of the CANN environment variable
reference, envref_07_0096 / hcclug_000080, and TorchAir's ``graph_pass.py``):

* 8.0.0: AIV only on Atlas A2, for AllReduce, AlltoAll and AlltoAllV; the A3 parts are not in the
  table (the variable is not supported there: the default mode is kept).
* 8.5.0: Atlas A2 AIV covers Broadcast, AllReduce, AlltoAll/AlltoAllV/AlltoAllVC, AllGather,
  ReduceScatter, AllGatherV and ReduceScatterV; Atlas A3 AIV covers Broadcast, AllReduce,
  ReduceScatter, AllGather and AlltoAll(V/VC).  AIV "does not support several communicators in
  parallel (several communicators cannot be configured AIV at the same time)".
* 9.0.0: the same AIV operator lists; AllReduce, ReduceScatter, AllGather and AlltoAll "support
  core limits": "if the Vector Core count the job assigns cannot meet the algorithm's
  requirement, HCCL reports an error giving the minimum Vector Core count".  The page gives no
  figure; the emulator takes one vector core per rank of the communicator (an AIV algorithm
  runs at least one block per peer).  TorchAir keeps static shape kernels beside a core limit
  from 9.0.0 on ("CANN 9.0.0 or later supports enabling both features"); before, it turns them
  off with a warning.

torch.distributed names: AllGatherV is ``all_gather`` with uneven sizes, AlltoAllV(C)
``all_to_all`` with splits, ReduceScatterV ``reduce_scatter`` with uneven inputs; the emulator
records each collective under its kind (``all_gather``, ``reduce_scatter``, ``all_to_all``, ...).
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT = "8.5.0"

_A2_8_0 = frozenset({"all_reduce", "all_to_all"})
_A2_8_5 = frozenset({"broadcast", "all_reduce", "all_to_all", "all_gather", "reduce_scatter"})
_A3_8_5 = frozenset({"broadcast", "all_reduce", "reduce_scatter", "all_gather", "all_to_all"})

AIV_RESTRICTION = ("HCCL's AIV mode does not support several communicators in parallel (several "
                   "communicators cannot be configured AIV at the same time; HCCL_OP_EXPANSION_MODE docs): "
                   "the behaviour is undefined. Give AIV mode to one communicator only (per process group: "
                   "ProcessGroupHCCL.Options().hccl_config = {'hccl_op_expansion_mode': 3}).")


@dataclass(frozen=True)
class Cann:
    version: str
    aiv_ops: dict                       # chip family ("A2", "A3") -> collectives HCCL runs in AIV mode
    aiv_limited_ops: frozenset = frozenset()   # AIV collectives that refuse a limit below their minimum
    static_kernel_with_core_limit: bool = False   # TorchAir keeps static kernels beside a core limit

    def aiv_minimum(self, kind: str, ranks: int) -> int:
        """The fewest vector cores the AIV algorithm of ``kind`` accepts (0: any limit is taken)."""
        return ranks if kind in self.aiv_limited_ops else 0


VERSIONS = {
    c.version: c for c in (
        Cann("8.0.0", {"A2": _A2_8_0, "A3": frozenset()}),
        Cann("8.5.0", {"A2": _A2_8_5, "A3": _A3_8_5}),
        Cann("9.0.0", {"A2": _A2_8_5, "A3": _A3_8_5},
             aiv_limited_ops=frozenset({"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}),
             static_kernel_with_core_limit=True),
    )
}


class UnknownCann(ValueError):
    """A CANN version the emulator has no table for."""


def lookup(version: str) -> Cann:
    try:
        return VERSIONS[version]
    except KeyError:
        raise UnknownCann(f"unknown CANN version {version!r}; known versions: {', '.join(VERSIONS)}") from None


def current() -> Cann:
    """The running test's CANN (the default outside a test)."""
    from ._context import CONTEXT

    return lookup(CONTEXT.config.cann)
