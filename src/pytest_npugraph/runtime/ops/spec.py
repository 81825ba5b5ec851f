"""One record per torch_npu op: the single source every op table is derived from.

A family module (``norms.py``, ``attention.py``, ``quant.py``, ``moe.py``, ``mc2.py``, ...) keeps
its ops' CPU math next to a ``SPECS`` list of :class:`OpSpec`.  The registry (``library.py``),
the op profiles, TorchAir's multi-inplace table (``compiler/reinplace.py``), the ops a captured
graph may update (``torch.npu.graph`` auto-dispatch) and the multi-rank MC2 kernels are all read
off these records, so adding an op touches one file.

Every op name of torch_npu 2.14.0 (its ``npu`` namespace and its ATB ops, ``torch.ops.atb``) that
no family module covers still exists, from the generated schema table (``_generated.py``), with
``impl=None``: calling it raises ``NotImplementedError``
naming the op, its schema and the ``pytest_npugraph_register_ops`` snippet that supplies it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

CoreDemand = Union[int, str]  # an int block count, or "all"


def cores(kind: str, cube: CoreDemand = 0, vector: CoreDemand = 0, all_resident: bool = False,
          limit_applies: bool = True, set_next_task_start: bool = False) -> dict:
    """A device profile dict (a fresh one per call, so no two ops share a mutable profile).

    ``kind``: "AICore" (cube or mixed cube+vector), "AIV" (vector only), "AICPU", "ATB", "HCCL",
    "MC2"; ``cube``/``vector``: blocks per core type ("all" = one per core of the device);
    ``all_resident``: every block must hold a core at once (full-core sync); ``limit_applies``:
    whether stream/op core limits reach the kernel.
    """
    profile = {"kind": kind, "cube": cube, "vector": vector, "all_resident": all_resident,
               "limit_applies": limit_applies}
    if set_next_task_start:
        profile["set_next_task_start"] = True
    return profile


def vector() -> dict:
    """An Ascend C vector kernel on every AIV core."""
    return cores("AIV", vector="all")


def cube() -> dict:
    """A cube (matmul) kernel on every AI Core."""
    return cores("AICore", cube="all")


def mix() -> dict:
    """Cube matmul with a vector epilogue (dequant, softmax, activation): both core types."""
    return cores("AICore", cube="all", vector="all")


def mc2() -> dict:
    """MC2 fused compute + communication: every AIV core at once, waiting on peers."""
    return cores("MC2", vector="all", all_resident=True)


def generated(name: str) -> str:
    """The verbatim torch_npu 2.14.0 schema of overload ``name`` ("op" or "op.overload") of its ``npu``
    or ``atb`` namespace, from the generated table, so a family module need not repeat a long schema."""
    from . import _generated

    for schema in _generated.SCHEMAS + _generated.ATB_SCHEMAS:
        if schema.startswith(name + "("):
            return schema
    raise KeyError(f"{name} is not an op of torch_npu 2.14.0's npu or atb namespace")


@dataclass(frozen=True)
class OpSpec:
    """One torch_npu op overload.

    ``schema``: verbatim from torch_npu 2.14.0 (``"name[.overload](...) -> ..."``).
    ``impl``: CPU reference math on CPU tensors (None: the op exists but has no math).
    ``meta``: shape/dtype rule on meta tensors (None: run ``impl`` on zeros; no impl: none).
    ``reinplace``: TorchAir's ``register_inplaceable_npu_op`` entry of this functional op,
    ``(in-place op name, mutated argument indices)``.
    ``graph_updatable``: captured ``torch.npu.graph(auto_dispatch_capture=True)`` may update it.
    ``mc2``: the multi-rank kernel ``fn(name, arguments: dict)`` used inside ``run_ranks`` (None from
    it: the single-device path); it issues the call with ``collectives.mc2_issue``.
    ``mc2_math``: that collective's math, ``fn(calls)``: once every member issued it, fills every
    rank's outputs from all ranks' calls (``collectives.MATH[name]``).
    ``namespace``: ``torch.ops.<namespace>``; ``"atb"`` for torch_npu's ATB ops (``torch_npu._npu_*``).
    ``autograd``: ``(setup_context, backward)`` for ``torch.library.register_autograd``, as torch_npu
    registers the op's backward (``npu_rotary_mul`` -> ``npu_rotary_mul_backward``).
    """

    schema: str
    impl: Optional[Callable] = None
    cores: Optional[dict] = None
    meta: Optional[Callable] = None
    reinplace: Optional[Tuple[str, Tuple[int, ...]]] = None
    graph_updatable: bool = False
    mc2: Optional[Callable] = None
    mc2_math: Optional[Callable] = None
    namespace: str = "npu"
    autograd: Optional[Tuple[Callable, Callable]] = None

    @property
    def name(self) -> str:
        """``"op"`` or ``"op.overload"``."""
        return self.schema[:self.schema.index("(")]

    @property
    def base(self) -> str:
        return self.name.split(".", 1)[0]
