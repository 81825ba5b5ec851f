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
    PTR = (4, "")
    INTERNAL = (5, "internal error")
    MEMORY = (6, "")
    NOT_SUPPORT = (7, "feature not supported")
    NOT_FOUND = (8, "resource not found")
    UNAVAIL = (9, "resource unavailable")
    ACL = (100, "call acl api failed")


_SUBMODULES = {"PTA": 0, "OPS": 1, "DIST": 2, "GRAPH": 3, "PROF": 4}


def _compact() -> bool:
    try:
        if int(os.environ.get("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0")) != 0:
            return True
    except ValueError:
        pass
    return hasattr(sys, "ps1")


def error_suffix(code: ErrCode, sub: str = "PTA", device: int = -1) -> str:
    if _compact():
        return ""
    number, text = code.value
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S")
    return (f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:{device}, RankID:-1) "
            f"ERR{_SUBMODULES[sub]:02d}{number:03d} {sub} {text}")


def pta_error(code: ErrCode) -> str:
    return error_suffix(code, "PTA")


def graph_error(code: ErrCode) -> str:
    return error_suffix(code, "GRAPH")
