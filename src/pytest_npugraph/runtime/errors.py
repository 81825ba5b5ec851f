"""torch_npu's error-message suffixes (``pta_error(ErrCode.X)``), so emulated errors read like real ones."""
from __future__ import annotations

import os
import sys
import time
from enum import Enum


class ErrCode(Enum):
    SUCCESS = (0, "success")
    PARAM = (1, "invalid parameter")
    TYPE = (2, "invalid type")
    VALUE = (3, "invalid value")
    PTR = (4, "invalid pointer")
    INTERNAL = (5, "internal error")
    MEMORY = (6, "memory error")
    NOT_SUPPORT = (7, "feature not supported")
    NOT_FOUND = (8, "resource not found")
    UNAVAIL = (9, "resource unavailable")
    SYSCALL = (10, "system call failed")
    TIMEOUT = (11, "timeout error")
    PERMISSION = (12, "permission error")
    ACL = (100, "call acl api failed")
    HCCL = (200, "call hccl api failed")
    GE = (300, "call ge api failed")
    EXCEPT = (999, "applicaiton exception")   # sic, as in torch_npu


_SUBMODULES = {"PTA": 0, "OPS": 1, "DIST": 2, "GRAPH": 3, "PROF": 4, "UNKNOWN": 99}


def _compact() -> bool:
    """No suffix with ``TORCH_NPU_COMPACT_ERROR_OUTPUT`` set to a non-zero int, or interactively."""
    try:
        if int(os.environ.get("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0")) != 0:
            return True
    except ValueError:
        pass
    return hasattr(sys, "ps1")


def _device() -> int:
    """The calling thread's device, -1 if it has none yet (``_npu_getLocalDevice``)."""
    module = sys.modules.get("pytest_npugraph.runtime.runtime")
    rt = module.peek() if module is not None else None
    return -1 if rt is None else rt.local_device()


def _rank() -> int:
    dist = sys.modules.get("torch.distributed")
    try:
        return dist.get_rank() if dist is not None and dist.is_initialized() else -1
    except Exception:
        return -1


def error_suffix(code: ErrCode, sub: str = "PTA") -> str:
    if _compact():
        return ""
    number, text = code.value
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime())
    return (f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:{_device()}, RankID:{_rank()}) "
            f"ERR{_SUBMODULES[sub]:02d}{number:03d} {sub} {text}")


def pta_error(code: ErrCode) -> str:
    return error_suffix(code, "PTA")


def ops_error(code: ErrCode) -> str:
    return error_suffix(code, "OPS")


def dist_error(code: ErrCode) -> str:
    return error_suffix(code, "DIST")


def graph_error(code: ErrCode) -> str:
    return error_suffix(code, "GRAPH")


def prof_error(code: ErrCode) -> str:
    return error_suffix(code, "PROF")
