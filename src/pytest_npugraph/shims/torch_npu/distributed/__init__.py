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

import torch.distributed as dist

from pytest_npugraph._context import CONTEXT
from pytest_npugraph.runtime import collectives as _collectives

from . import _process_group
from ._process_group import ProcessGroupHCCL

__all__ = ["is_hccl_available", "ProcessGroupHCCL"]


def is_hccl_available() -> bool:
    return "hccl" in dist.Backend.backend_list


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
