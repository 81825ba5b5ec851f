"""Kernels user code registered for the npu dispatch key (``PrivateUse1``).

vLLM-Ascend and its peers register custom ops with ``torch.library`` for ``PrivateUse1`` (``Library.impl``,
``torch.library.impl(..., "npu")``, ``custom_op(..., device_types="npu")``, vLLM's
``direct_register_custom_op``): on hardware those kernels run with the NPU tensors.  The dispatch core
calls them the same way (``special_ops._npu_key_or_run``), so the ops inside are dispatched, recorded and
checked like any others.  The emulator's own npu-key registrations (``backend``, torchair's control
ops, SuperKernel scopes) are told apart by where they were registered.
"""
from __future__ import annotations

import os

import torch

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the pytest_npugraph package
_PREFIX = "PrivateUse1: registered at "
# ``torch.library``'s live set of Python registrations ("ns/op/DispatchKey"), kept up to date by
# ``Library.impl``, ``Library._destroy`` and the Library finalizer: a set lookup per call (asking the
# dispatcher, ``_dispatch_has_kernel_for_dispatch_key``, costs some 80 us).  C++ registrations are not
# in it: an extension's npu kernels cannot load on a CPU machine anyway.
_python_impls = torch.library._impls
_verdicts: dict = {}      # "ns/op/PrivateUse1" -> whether that registration is the user's


def has_user_kernel(name: str) -> bool:
    """Whether op ``name`` ("ns::op.overload") has a ``PrivateUse1`` kernel registered by user code
    through ``torch.library`` (not by this package: its registrations are made from files under
    ``pytest_npugraph``)."""
    namespace, _, op = name.partition("::")
    key = f"{namespace}/{op}/PrivateUse1"
    if key not in _python_impls:
        if key in _verdicts:
            del _verdicts[key]       # a registration removed (its Library destroyed) is forgotten
        return False
    verdict = _verdicts.get(key)
    if verdict is None:
        verdict = _verdicts[key] = _registered_by_user(name)
    return verdict


def _registered_by_user(name: str) -> bool:
    if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
        return False
    for line in torch._C._dispatch_dump(name).splitlines():
        if line.startswith(_PREFIX):
            where = line[len(_PREFIX):].split(" :: ", 1)[0]
            path = os.path.abspath(where.rsplit(":", 1)[0]) if ":" in where else where
            return not (path.startswith(_OWN + os.sep) or path.endswith((".cpp", ".h")))
    return False
