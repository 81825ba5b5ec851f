"""Block-wise dynamic quantisation: npu_dynamic_block_quant (torch_npu's docstring and meta registration).

x (2-D [M, N] or 3-D [B, M, N], float16/bfloat16) is cut into blocks of ``row_block_size`` x ``col_block_size``
over its last two dims; each block gets ``scale = max(max|x_block| / qmax, min_scale)`` (qmax: 127 for int8,
448 / 57344 for float8 e4m3fn / e5m2, or ``dst_type_max`` when given) and ``y = rint(x / scale)``, saturated.
Returns ``(y, scale)``, scale float32 of shape [..., ceil(M / row_block_size), ceil(N / col_block_size)].
"""
from __future__ import annotations

import math

import torch

from ._common import _check, _dtype_of
from .spec import OpSpec, generated, vector

_OP = "npu_dynamic_block_quant"
_QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _target(dst_type):
    dtype = _dtype_of(dst_type)
    return dtype if dtype in _QMAX else None


def npu_dynamic_block_quant(x, *, min_scale=0.0, round_mode="rint", dst_type=1, row_block_size=1,
                            col_block_size=128, dst_type_max=0.0):
    if x.dim() not in (2, 3):
        raise RuntimeError(f"Expected x to have 2 or 3 dimensions, but got {x.dim()}.")
    target = _target(dst_type)
    _check(target is not None, lambda: f"{_OP}: dst_type {dst_type} is not supported (int8 (1), float8_e5m2 (23), "
                                       "float8_e4m3fn (24))")
    _check(x.dtype in (torch.float16, torch.bfloat16),
           lambda: f"{_OP}: x must be float16 or bfloat16, but got {x.dtype}")
    _check(min_scale >= 0, lambda: f"{_OP}: min_scale must be >= 0, but got {min_scale}")
    _check(round_mode == "rint", lambda: f"{_OP}: round_mode only supports rint, but got {round_mode}")
    _check(row_block_size > 0 and col_block_size > 0,
           lambda: f"{_OP}: row_block_size and col_block_size must be positive")
    qmax = dst_type_max if dst_type_max else _QMAX[target]
    xf = x.float().reshape(-1, *x.shape[-2:])
    batch, rows, cols = xf.shape
    rb, cb = math.ceil(rows / row_block_size), math.ceil(cols / col_block_size)
    padded = torch.nn.functional.pad(xf, (0, cb * col_block_size - cols, 0, rb * row_block_size - rows))
    blocks = padded.reshape(batch, rb, row_block_size, cb, col_block_size)
    scale = torch.clamp(blocks.abs().amax(dim=(2, 4)) / qmax, min=min_scale)                # [B, rb, cb]
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    y = (blocks / safe[:, :, None, :, None]).reshape(batch, rb * row_block_size, cb * col_block_size)[:, :rows, :cols]
    if target == torch.int8:
        y = torch.round(y).clamp(-128, 127).to(torch.int8)
    else:
        y = y.clamp(-qmax, qmax).to(target)
    return y.reshape(x.shape), scale.reshape(*x.shape[:-2], rb, cb)


def _block_quant_meta(x, *, min_scale=0.0, round_mode="rint", dst_type=1, row_block_size=1, col_block_size=128,
                      dst_type_max=0.0):
    if x.dim() not in (2, 3):
        raise RuntimeError(f"Expected x to have 2 or 3 dimensions, but got {x.dim()}.")
    shape = list(x.shape)
    shape[-2], shape[-1] = math.ceil(shape[-2] / row_block_size), math.ceil(shape[-1] / col_block_size)
    return x.new_empty(x.shape, dtype=_target(dst_type) or torch.float8_e5m2), x.new_empty(shape, dtype=torch.float32)


SPECS = [OpSpec(generated(_OP), npu_dynamic_block_quant, vector(), meta=_block_quant_meta)]
