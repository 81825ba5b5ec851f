"""Core limits per device and per stream (mirrors ``torch_npu/npu/npu_config.py``)."""
from __future__ import annotations

import functools

import torch_npu
from torch_npu import _C
from pytest_npugraph.runtime.errors import ErrCode, pta_error


class _call_once_class:
    """torch_npu allows ``set_device_limit`` once per process; the emulator, once per test."""

    def __init__(self, func):
        self.func = func
        functools.update_wrapper(self, func)   # inspect.signature shows (device, cube_num=-1, vector_num=-1)

    def _calls(self) -> set:
        from pytest_npugraph.runtime.runtime import current

        return current().stash.called_once

    @property
    def called(self) -> bool:
        return self.func in self._calls()

    def __call__(self, *args, **kwargs):
        if self.called:
            raise RuntimeError(
                f"Function '{self.func.__name__}' has already been called, You can only set this interface once.")
        self._calls().add(self.func)
        return self.func(*args, **kwargs)


def _check_device(device) -> None:
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device must be an int, but got {type(device).__name__}{pta_error(ErrCode.TYPE)}")
    if device < 0 or device >= torch_npu.npu.device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))


def _check_stream(stream) -> None:
    if stream is None:
        raise AssertionError("stream cannot be None" + pta_error(ErrCode.PARAM))
    if not isinstance(stream, torch_npu.npu.Stream):
        raise AssertionError(f"stream should be torch_npu.npu.Stream, could not be {type(stream)}"
                             + pta_error(ErrCode.TYPE))


@_call_once_class
def set_device_limit(device, cube_num=-1, vector_num=-1):
    """Limit the cube/vector cores every op on ``device`` may use (-1 leaves one unchanged)."""
    _check_device(device)
    torch_npu.npu._lazy_init()
    if cube_num != -1:
        _C._npu_set_device_res_limit(device, 0, cube_num)
    if vector_num != -1:
        _C._npu_set_device_res_limit(device, 1, vector_num)


def get_device_limit(device):
    _check_device(device)
    torch_npu.npu._lazy_init()
    return {"cube_core_num": _C._npu_get_device_res_limit(device, 0),
            "vector_core_num": _C._npu_get_device_res_limit(device, 1)}


def _stream_ids(stream) -> dict:
    return dict(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)


def set_stream_limit(stream, cube_num=-1, vector_num=-1):
    """Limit the cores ops issued on ``stream`` may use (-1 leaves one unchanged)."""
    _check_stream(stream)
    torch_npu.npu._lazy_init()
    if cube_num != -1:
        _C._npu_set_stream_res_limit(**_stream_ids(stream), type=0, value=cube_num)
    if vector_num != -1:
        _C._npu_set_stream_res_limit(**_stream_ids(stream), type=1, value=vector_num)


def reset_stream_limit(stream):
    _check_stream(stream)
    torch_npu.npu._lazy_init()
    _C._npu_reset_stream_res_limit(**_stream_ids(stream))


def get_stream_limit(stream):
    _check_stream(stream)
    torch_npu.npu._lazy_init()
    return {"cube_core_num": _C._npu_get_stream_res_limit(**_stream_ids(stream), type=0),
            "vector_core_num": _C._npu_get_stream_res_limit(**_stream_ids(stream), type=1)}


# ------------------------------------------------------------------ options (torch_npu._C._npu_setOption)
# Switches of the real runtime that change how kernels are compiled or which formats and precisions
# they use.  Ops compute on the CPU here, so they change no result; they are kept per test (every
# test starts with the defaults) so that reading them back answers what was set.
_OPTION_DEFAULTS = {"jitCompile": "disable", "ALLOW_INTERNAL_FORMAT": "disable",
                    "ALLOW_MATMUL_HF32": "disable", "ALLOW_CONV_HF32": "enable"}


def _options() -> dict:
    from pytest_npugraph.runtime.runtime import current

    return current().extensions.setdefault("npu_config.options", dict(_OPTION_DEFAULTS))


def set_compile_mode(jit_compile=False):
    if torch_npu.npu.is_initialized():
        torch_npu.npu.synchronize()
    _options()["jitCompile"] = "enable" if jit_compile else "disable"


def is_jit_compile_false() -> bool:
    torch_npu.npu._lazy_init()
    return _options()["jitCompile"] == "disable"


class _npuConfig:
    """``torch.npu.config``: ``allow_internal_format`` can be set (as in torch_npu it cannot be read back)."""

    @classmethod
    def __setattr__(cls, name, value):
        if name == "allow_internal_format":
            _options()["ALLOW_INTERNAL_FORMAT"] = "enable" if value else "disable"


def _check_hf32(value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"allow_hf32 must be a bool, but got {type(value).__name__}{pta_error(ErrCode.TYPE)}")


class _AllowHF32:
    """``allow_hf32`` of ``torch.npu.matmul`` / ``torch.npu.conv``: kept in the per-test option ``_option``."""

    _option = ""

    @classmethod
    def __setattr__(cls, name, value):
        if name == "allow_hf32":
            _check_hf32(value)
            _options()[cls._option] = "enable" if value else "disable"

    @classmethod
    def __getattr__(cls, name):
        if name == "allow_hf32":
            return _options()[cls._option] == "enable"
        return None


class _allowHF32Matmul(_AllowHF32):
    """``torch.npu.matmul.allow_hf32`` (default False)."""

    _option = "ALLOW_MATMUL_HF32"


class _allowHF32Conv(_AllowHF32):
    """``torch.npu.conv.allow_hf32`` (default True)."""

    _option = "ALLOW_CONV_HF32"
