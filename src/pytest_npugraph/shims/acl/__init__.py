"""Emulated ``acl`` (pyACL, CANN's Python binding of AscendCL) under pytest-npugraph.

A machine with an NPU has pyACL; code such as vLLM-Ascend's sleep-mode allocator imports
``acl.rt.memcpy`` at module level, so without it the module (and every test of it) fails at import.
Here ``acl`` answers the calls that only ask about or set up the device from the emulated runtime, in
pyACL's shape (results then the return code, 0 for ACL_SUCCESS); copies between raw device addresses
are not emulated (``pytest_npugraph.NotEmulated``): emulated device memory is reached through tensors.
"""
from . import rt  # noqa: F401
from .rt import ACL_ERROR_INVALID_PARAM, ACL_SUCCESS  # noqa: F401

_EMULATED = True


def init(config_path: str = "") -> int:
    return ACL_SUCCESS


def finalize() -> int:
    return ACL_SUCCESS


def get_recent_err_msg() -> str:
    return ""
