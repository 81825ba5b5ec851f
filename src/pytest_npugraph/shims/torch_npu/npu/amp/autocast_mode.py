"""``torch.npu.amp.autocast`` (mirrors ``torch_npu/npu/amp/autocast_mode.py``)."""
from __future__ import annotations

import functools
from typing import Any

import torch
from typing_extensions import deprecated

__all__ = ["autocast", "custom_fwd", "custom_bwd"]


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.npu.amp.autocast(args...)`` is ``torch.autocast("npu", args...)``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    def __enter__(self):
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any):  # type: ignore[override]
        return super().__exit__(exc_type, exc_val, exc_tb)

    def __call__(self, func):
        return super().__call__(func)


@deprecated("`torch_npu.npu.amp.custom_fwd(args...)` is deprecated. "
            "Please use `torch.amp.custom_fwd(args..., device_type='npu')` instead.", category=FutureWarning)
def custom_fwd(fwd=None, *, cast_inputs=None):
    return functools.partial(torch.amp.custom_fwd, device_type="npu")(fwd=fwd, cast_inputs=cast_inputs)


@deprecated("`torch_npu.npu.amp.custom_bwd(args...)` is deprecated. "
            "Please use `torch.amp.custom_bwd(args..., device_type='npu')` instead.", category=FutureWarning)
def custom_bwd(bwd):
    return functools.partial(torch.amp.custom_bwd, device_type="npu")(bwd)
