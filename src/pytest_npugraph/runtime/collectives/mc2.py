"""The MC2 ops' cross-rank glue: which communicator an op's ``group_ep``/``hcom`` names, whether the
call is a rank's, and its issue as a collective of that communicator (their math and their single-rank
paths live with their specs in ops/mc2.py)."""
from __future__ import annotations

from typing import Optional

from ...errors import NotEmulated
from ..tensor import NpuTensor, wrap
from .c10d_math import MATH
from .ranks import Call, binding

def mc2_issue(name: str, group: str, arguments: dict, outputs: dict, params: Optional[dict] = None) -> tuple:
    """Issue MC2 op ``name`` of the calling rank on the HCCL communicator named ``group`` and wait
    for its peers; returns the outputs as the rank's NPU tensors, in order.

    ``arguments``: the op's bound arguments (its NPU tensors are what it reads); ``outputs``:
    fresh CPU payloads of its outputs; the op's collective math (``MATH[name]``, its
    ``OpSpec.mc2_math``) fills every rank's outputs once all issued, reading each call's
    ``params``: the arguments' CPU payloads updated with ``params`` (``params["out"]``, default
    ``outputs``, is where to write).
    """
    if name not in MATH:
        raise RuntimeError(f"{name}: no collective math (its OpSpec has no mc2_math)")
    b = binding()
    if b is None:
        raise RuntimeError(f"{name}: a multi-rank call needs the ranks of npugraph.run_ranks(fn); pass the "
                           f"group's HCCL comm name")
    job, rank = b
    comm = job.by_name(group)
    if comm is None:
        raise RuntimeError(f"{name}: {group!r} is not an HCCL communicator of this rank; get it with "
                           f"pg._get_backend(torch.device('npu')).get_hccl_comm_name(rank)")
    payloads = {k: (v._payload if isinstance(v, NpuTensor) else v) for k, v in arguments.items()}
    payloads["out"] = outputs
    payloads.update(params or {})
    inputs = tuple(v for v in arguments.values() if isinstance(v, NpuTensor))
    device = inputs[0].device.index
    wrapped = tuple(wrap(v, device) for v in outputs.values())
    job.issue(comm, rank, Call(name, f"npu::{name}", inputs, wrapped, payloads))
    return wrapped


def inside_ranks() -> bool:
    """Whether the caller is a rank (a ``run_ranks`` thread or a rank process)."""
    return binding() is not None


def needs_ranks(name: str, world_size: int, size_arg: str = "world_size", group_arg: str = "hcom") -> RuntimeError:
    return RuntimeError(f"{name}: {size_arg}={world_size} needs {world_size} ranks: run the rank function with "
                        f"npugraph.run_ranks(fn) and pass the group's HCCL comm name as {group_arg}")


def group(name: str, a: dict, group_arg: str):
    """``(communicator, this rank's index in it)`` of the HCCL comm name in argument ``group_arg``
    (``hcom``, ``group_ep``) of a rank's call."""
    job, rank = binding()
    comm = job.by_name(a[group_arg])
    if comm is None:
        raise RuntimeError(f"{name}: {group_arg}={a[group_arg]!r} is not an HCCL communicator of this rank; get it "
                           f"with pg._get_backend(torch.device('npu')).get_hccl_comm_name(rank)")
    return comm, comm.members.index(rank)


def moe_group(name: str, a: dict) -> None:
    """Check a multi-rank dispatch/combine call (v1 or v2) against its ``group_ep`` communicator."""
    world = a["ep_world_size"]
    if not inside_ranks():
        raise needs_ranks(name, world, "ep_world_size", "group_ep")
    comm, me = group(name, a, "group_ep")
    if a["tp_world_size"] > 1 or a["shared_expert_rank_num"] or a.get("comm_quant_mode"):
        raise NotEmulated(f"{name}: tensor parallelism (tp_world_size > 1), shared-expert ranks and "
                          f"quantised communication are not emulated by pytest-npugraph")
    if world != len(comm.members) or a["ep_rank_id"] != me:
        raise RuntimeError(f"{name} on rank {binding()[1]}: ep_world_size={world}, "
                           f"ep_rank_id={a['ep_rank_id']}, but {comm.name!r} has {len(comm.members)} ranks and "
                           f"this is rank {me} of it")
    if a["moe_expert_num"] % world:
        raise RuntimeError(f"{name}: moe_expert_num={a['moe_expert_num']} is not a multiple of ep_world_size={world}")
