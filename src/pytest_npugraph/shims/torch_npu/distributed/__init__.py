"""Emulated ``torch_npu.distributed``: the ``"hccl"`` backend of ``torch.distributed`` across the
emulated NPUs of a test (docs/reference.md, "The emulated surface" and "The npugraph fixture":
``npugraph.run_ranks``).

Importing it (``import torch_npu`` does) registers ``hccl`` as torch_npu does, first, so it
is the default backend of the ``npu`` device, then ``lccl`` the same way; adds
``torch.distributed.is_hccl_available``; exposes ``torch_npu._C._distributed_c10d``
(``ProcessGroupHCCL`` and its ``Options``); and routes the multi-rank MC2 ops
(``npu_moe_distribute_dispatch`` / ``combine``) to the collectives engine.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import warnings

import torch
import torch.distributed as dist

from pytest_npugraph._context import CONTEXT
from pytest_npugraph.runtime import collectives as _collectives

from . import _process_group
from ._process_group import ProcessGroupHCCL

__all__ = ["is_hccl_available", "ProcessGroupHCCL", "reduce_scatter_tensor_uneven", "all_gather_into_tensor_uneven",
           "all_to_all_vc"]


def is_hccl_available() -> bool:
    return "hccl" in dist.Backend.backend_list


def _npu_group(name: str, output, input, group):
    """The process group of torch_npu's own collectives (the default group for None), or None with
    torch_npu's warnings when the rank is outside the group or a tensor is not on the npu."""
    c10d = dist.distributed_c10d
    c10d._check_single_tensor(output, "output")
    c10d._check_single_tensor(input, "input")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{name}(): group must be a ProcessGroup or None, not {type(group).__name__}")
    if c10d._rank_not_in_group(group):
        c10d._warn_not_in_group(name)
        return None
    if output.device.type != "npu" or input.device.type != "npu":
        warnings.warn("Support for Tensors is limited to those of type npu")
        return None
    if group is None or group is c10d.GroupMember.WORLD:
        group = c10d._get_default_group()
    return group


def _finish(work, async_op: bool):
    if async_op:
        return work
    work.wait()
    return None


def reduce_scatter_tensor_uneven(output, input, input_split_sizes=None, op=dist.ReduceOp.SUM, group=None,
                                 async_op=False):
    """``torch_npu.distributed.reduce_scatter_tensor_uneven`` (HCCL ReduceScatterV): rank r receives the
    reduction of rows ``[sum(input_split_sizes[:r]), +input_split_sizes[r])`` of every rank's input."""
    group = _npu_group("reduce_scatter_tensor_uneven", output, input, group)
    if group is None:
        return None
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = op
    backend = group._get_backend(torch.device("npu"))
    return _finish(backend.reduce_scatter_tensor_uneven(output, input, list(input_split_sizes or []), opts), async_op)


def all_gather_into_tensor_uneven(output, input, output_split_sizes=None, group=None, async_op=False):
    """``torch_npu.distributed.all_gather_into_tensor_uneven`` (HCCL AllGatherV): rows
    ``[sum(output_split_sizes[:r]), +output_split_sizes[r])`` of every rank's output are rank r's input."""
    group = _npu_group("all_gather_into_tensor_uneven", output, input, group)
    if group is None:
        return None
    backend = group._get_backend(torch.device("npu"))
    return _finish(backend.all_gather_into_tensor_uneven(output, input, list(output_split_sizes or [])), async_op)


def all_to_all_vc(output, input, send_count_matrix, group=None, async_op=False):
    """``torch_npu.distributed.all_to_all_vc`` (HCCL AlltoAllVC): ``send_count_matrix[i][j]`` elements go
    from rank i to rank j; every rank passes the same full matrix."""
    group = _npu_group("all_to_all_vc", output, input, group)
    if group is None:
        return None
    size = dist.get_world_size(group)
    if not isinstance(send_count_matrix, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in send_count_matrix):
        raise TypeError(f"all_to_all_vc(): send_count_matrix must be a list of lists of ints, "
                        f"not {type(send_count_matrix).__name__}")
    if len(send_count_matrix) != size:
        raise ValueError(f"send_count_matrix must have {size} rows (group size), got {len(send_count_matrix)}")
    for row in send_count_matrix:
        if len(row) != size:
            raise ValueError(f"send_count_matrix must be a square [{size}][{size}] matrix; "
                             f"got a row of length {len(row)}")
    flat = [int(v) for row in send_count_matrix for v in row]
    backend = group._get_backend(torch.device("npu"))
    return _finish(backend.alltoallvc(output, input, flat), async_op)


def _outside_run_ranks(bound) -> None:
    """``init_process_group`` with an ``hccl`` world of several ranks, called in the test's own thread:
    fail at once.  torch would first rendezvous (``env://`` with ``MASTER_ADDR``/``MASTER_PORT`` set waits
    for the other ranks, which never come, until its 30-minute timeout)."""
    if _collectives.binding() is not None:      # a rank thread of npugraph.run_ranks: its own rendezvous
        return
    if CONTEXT.child:       # a process a test started: its peers are processes too (runtime/collectives/processes.py)
        return
    backend = bound.arguments.get("backend")
    if backend is not None and not any(name in str(backend).lower() for name in ("hccl", "lccl")):
        return
    size = bound.arguments.get("world_size", -1)
    if size is None or size == -1:
        size = os.environ.get("WORLD_SIZE")
        init_method = str(bound.arguments.get("init_method") or "")
        match = re.search(r"[?&]world_size=(\d+)", init_method)
        size = match.group(1) if match else size
    try:
        size = int(size)
    except (TypeError, ValueError):
        return
    if size > 1:
        raise RuntimeError(
            f"init_process_group(backend={backend!r}, world_size={size}) outside npugraph.run_ranks: the other "
            f"ranks never start here, so the rendezvous would wait until it times out. Run the per-rank function "
            f"with npugraph.run_ranks(fn), which starts one rank per emulated NPU "
            f"(@pytest.mark.npu_devices({size})).")


def _guard_init_process_group() -> None:
    original = dist.init_process_group
    if getattr(original, "_npugraph", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)    # torch reports the bad call
        _outside_run_ranks(bound)
        return original(*args, **kwargs)

    init_process_group._npugraph = True
    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


def _guard_batch_isend_irecv() -> None:
    """``batch_isend_irecv`` on an hccl group: HCCL runs a batch's sends and receives as one group, so
    their order in the list cannot deadlock.  Issued one by one (a task each, on the current stream,
    paired per direction in issue order), they are issued in one order every rank agrees on: by the
    pair of ranks, then the direction, then the list's order, which pairs the same sends and receives
    and never waits in a circle.  Items whose peer is the rank itself (HcclBatchSendRecv takes them)
    pair in order, an isend with an irecv, as a device copy."""
    original = dist.batch_isend_irecv
    if getattr(original, "_npugraph", False):
        return

    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list):
        dist.distributed_c10d._check_p2p_op_list(p2p_op_list)
        group = p2p_op_list[0].group or dist.distributed_c10d._get_default_group()
        if not isinstance(group, _process_group.HcclProcessGroup):
            return original(p2p_op_list)
        me = group.rank()
        _process_group._check_tensors([op.tensor for op in p2p_op_list])     # the whole batch, before any item
        own = [op for op in p2p_op_list if op.group_peer == me]
        if own:       # HcclBatchSendRecv takes items whose peer is the rank itself: a local copy each
            sends = [op for op in own if op.op is dist.isend]
            recvs = [op for op in own if op.op is not dist.isend]
            if len(sends) != len(recvs):
                raise RuntimeError(f"batch_isend_irecv: rank {me} sends {len(sends)} tensor(s) to itself and receives "
                                   f"{len(recvs)}: each isend to the rank itself pairs with an irecv from it, in order")
            for send, recv in zip(sends, recvs):
                recv.tensor.copy_(send.tensor)
        others = [op for op in p2p_op_list if op.group_peer != me]

        def key(item):
            index, op = item
            src, dst = (me, op.group_peer) if op.op is dist.isend else (op.group_peer, me)
            return (min(src, dst), max(src, dst), src > dst, index)
        ordered = [op for _, op in sorted(enumerate(others), key=key)]
        return (original(ordered) if ordered else []) + [_process_group._done([op.tensor]) for op in own]

    batch_isend_irecv._npugraph = True
    dist.batch_isend_irecv = batch_isend_irecv
    dist.distributed_c10d.batch_isend_irecv = batch_isend_irecv


def _register() -> None:
    for name in ("hccl", "lccl"):
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, _process_group.create, extended_api=True, devices=["npu"])
    dist.is_hccl_available = is_hccl_available
    c_module = sys.modules.get("torch_npu._C")
    if c_module is not None:
        c_module._distributed_c10d = _process_group
        sys.modules.setdefault("torch_npu._C._distributed_c10d", _process_group)
    _collectives.install()
    _guard_init_process_group()
    _guard_batch_isend_irecv()


_register()
