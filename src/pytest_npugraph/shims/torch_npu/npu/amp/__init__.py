"""Emulated ``torch_npu.npu.amp`` (``torch.npu.amp``): autocast regions and gradient scaling on npu.

The autocast kernels of the ``npu`` key are the runtime's (``pytest_npugraph.runtime.autocast``).
"""
from __future__ import annotations

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]

from .autocast_mode import autocast, custom_bwd, custom_fwd  # noqa: E402
from .grad_scaler import GradScaler  # noqa: E402
