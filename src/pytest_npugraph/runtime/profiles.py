"""Op profiles: what each op asks of a device's cores (kind, cube/vector blocks, residency).

Sources, first match wins: the users' ``pytest_npugraph_op_profile`` hook, the custom-op
family specs (runtime/ops/registry), the aten table (ops/aten.py), then a default (vector op using every vector core).
"""
from __future__ import annotations

from .. import trace as T
from .._context import CONTEXT

COPY = T.OpCores(kind="AIV", vector=0, cube=0)   # DMA copies hold no AI cores


def _base_name(op: str) -> str:
    name = op.split("::")[-1].split(" ")[0]
    return name.split(".")[0]


def to_cores(spec, device) -> T.OpCores:
    """Turn a declarative profile (dict, OpCores or None) into OpCores for ``device``."""
    if spec is None:
        return T.OpCores(kind="AIV", vector=device.vector_cores)
    if isinstance(spec, T.OpCores):
        return spec

    def count(value, total):
        if value in ("all", None):
            return total if value == "all" else 0
        return min(int(value), total)

    kind = spec.get("kind", "AIV")
    cube = count(spec.get("cube", "all" if kind == "AICore" else 0), device.cube_cores)
    vector = count(spec.get("vector", "all" if kind in ("AIV", "HCCL", "MC2") else 0), device.vector_cores)
    limit_applies = spec.get("limit_applies", kind not in ("AICPU", "ATB"))
    return T.OpCores(kind, cube, vector, bool(spec.get("all_resident", False)), bool(limit_applies),
                     bool(spec.get("set_next_task_start", False)))


def _lookup(name: str):
    found = CONTEXT.op_profile(name)
    if found is not None:
        return found
    from .ops import aten, library

    spec = library.cores_of(name)
    return spec if spec is not None else aten.ATEN_CORES.get(name)


def resolve(op: str, device) -> T.OpCores:
    """The op's profile on ``device`` (cached on the device, which lives for one test: hook answers
    may differ between tests)."""
    cache = device.profiles
    found = cache.get(op)
    if found is None:
        found = cache[op] = to_cores(_lookup(_base_name(op)), device)
    return found
