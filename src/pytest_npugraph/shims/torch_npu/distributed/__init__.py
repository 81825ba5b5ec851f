"""Emulated ``torch_npu.distributed``: the ``"hccl"`` backend of ``torch.distributed`` across the
emulated NPUs of a test (CONTRACT §2, §4 ``npugraph.run_ranks``).

Importing it (``import torch_npu`` does) registers ``hccl`` as torch_npu does, first, so it
is the default backend of the ``npu`` device, then ``lccl`` the same way; adds
``torch.distributed.is_hccl_available``; exposes ``torch_npu._C._distributed_c10d``
(``ProcessGroupHCCL`` and its ``Options``); and routes the multi-rank MC2 ops
(``npu_moe_distribute_dispatch`` / ``combine``) to the collectives engine.
"""
from __future__ import annotations

import sys

import torch.distributed as dist

from pytest_npugraph.runtime import collectives as _collectives

from . import _process_group
from ._process_group import ProcessGroupHCCL

__all__ = ["is_hccl_available", "ProcessGroupHCCL"]


def is_hccl_available() -> bool:
    return "hccl" in dist.Backend.backend_list


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


_register()
