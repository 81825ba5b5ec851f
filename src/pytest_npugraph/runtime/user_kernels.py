"""Kernels user code registered for the npu dispatch key (``PrivateUse1``).

vLLM-Ascend and its peers register custom ops with ``torch.library`` for ``PrivateUse1`` (``Library.impl``,
``torch.library.impl(..., "npu")``, ``custom_op(..., device_types="npu")``, vLLM's
``direct_register_custom_op``): on hardware those kernels run with the NPU tensors.  The dispatch core
calls them the same way (``tensor._npu_key_or_run``), so the ops inside are dispatched, recorded and
checked like any others.  The emulator's own npu-key registrations (``backend``, torchair's control
ops, SuperKernel scopes) are told apart by where they were registered.
"""
from __future__ import annotations

import os

import torch

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the pytest_npugraph package
_PREFIX = "PrivateUse1: registered at "
_verdicts: dict = {}      # op name -> whether its PrivateUse1 kernel is the user's (while it has one)
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key


def has_user_kernel(name: str) -> bool:
    """Whether op ``name`` ("ns::op.overload") has a ``PrivateUse1`` kernel registered by user code:
    not by this package, nor by torch's C++ (a registration file under ``pytest_npugraph``, or ``.cpp``)."""
    if not _has_kernel(name, "PrivateUse1"):
        _verdicts.pop(name, None)        # a registration removed (its Library deleted) is forgotten
        return False
    verdict = _verdicts.get(name)
    if verdict is None:
        verdict = _verdicts[name] = _registered_by_user(name)
    return verdict


def _registered_by_user(name: str) -> bool:
    for line in torch._C._dispatch_dump(name).splitlines():
        if line.startswith(_PREFIX):
            where = line[len(_PREFIX):].split(" :: ", 1)[0]
            path = os.path.abspath(where.rsplit(":", 1)[0]) if ":" in where else where
            return not (path.startswith(_OWN + os.sep) or path.endswith((".cpp", ".h")))
    return False
