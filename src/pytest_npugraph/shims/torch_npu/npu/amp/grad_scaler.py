"""``torch.npu.amp.GradScaler``: torch's scaler on the npu device (``dynamic=False`` keeps the scale)."""
from __future__ import annotations

import torch

from pytest_npugraph.runtime.errors import ErrCode, pta_error

__all__ = ["GradScaler"]


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale=2. ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 dynamic=True, enabled=True):
        if enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0." + pta_error(ErrCode.VALUE))
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0." + pta_error(ErrCode.VALUE))
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic

    def update(self, new_scale=None):
        if not self._enabled:
            return
        if not self._dynamic and new_scale is None:
            self._per_optimizer_states.clear()     # a static scale: keep it, just start the next iteration
            return
        super().update(new_scale)
