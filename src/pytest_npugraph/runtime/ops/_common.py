"""Shared helpers of the op families: torch_npu's dtype numbering, checks, rounding, int4 packing.

Every op function of a family module is pure (CPU tensors in, new CPU tensors out, nothing cached, no
device state), except the ops whose schema marks an argument written (``Tensor(a!)``): they update it
in place as the real kernel does.  Signatures follow the op schemas of torch_npu 2.14.0 (argument
names, order, ``*``, defaults), so a family's ``SPECS`` hand them to ``torch.library`` unchanged.

Numerics: fp16/bf16 inputs are computed in float32 (the NPU kernels accumulate in fp32) and
cast back at the end; integer matmuls accumulate exactly in float64.  Where a meta kernel of
the real wheel raises a ``torch._check`` failure, the same message head is raised here as a
``RuntimeError`` (the ``[ERROR] ... ERR01003 OPS ...`` suffix the product appends is left out, as
with ``TORCH_NPU_COMPACT_ERROR_OUTPUT=1``).  Features the emulator does not model raise
``pytest_npugraph.NotEmulated`` (a ``NotImplementedError``) naming the op and the feature.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...errors import NotEmulated


# ----------------------------------------------------------------------------- dtypes
# torch.ScalarType numbers as torch_npu passes them through ``int?`` dtype arguments,
# plus the torch_npu-only dtype constants (torch_npu/_C ScalarType extensions).
INT4, HIFLOAT8, FLOAT8_E8M0FNU, FLOAT4_E2M1FN_X2, FLOAT4_E1M2FN_X2 = 285, 290, 293, 296, 297
_NPU_DTYPE_NAMES = {
    INT4: "torch_npu.int4", HIFLOAT8: "torch_npu.hifloat8", FLOAT8_E8M0FNU: "torch_npu.float8_e8m0fnu",
    FLOAT4_E2M1FN_X2: "torch_npu.float4_e2m1fn_x2", FLOAT4_E1M2FN_X2: "torch_npu.float4_e1m2fn_x2",
}
_ENUM_TO_DTYPE = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
    6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16, 16: torch.quint4x2,
    23: torch.float8_e5m2, 24: torch.float8_e4m3fn,
}
_DTYPE_MAX = {torch.int8: 127.0, torch.quint4x2: 7.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_ENUM_OF_DTYPE = {dtype: enum for enum, dtype in _ENUM_TO_DTYPE.items()}


def _dtype_of(value) -> Optional[torch.dtype]:
    """A ``torch.dtype`` for an ``int?`` / ``ScalarType?`` argument (None stays None)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    return _ENUM_TO_DTYPE.get(int(value))


def _dtype_str(value) -> str:
    """How torch_npu's meta kernels print a dtype argument in messages."""
    if isinstance(value, int) and value in _NPU_DTYPE_NAMES:
        return _NPU_DTYPE_NAMES[value]
    dtype = _dtype_of(value)
    return str(value) if dtype is None else str(dtype)


def _check(cond: bool, message) -> None:
    """``torch._check`` with the message computed only on failure."""
    if not cond:
        raise RuntimeError(message() if callable(message) else message)


def _unsupported(op: str, feature: str):
    return NotEmulated(
        f"{op}: {feature} is not supported by the pytest-npugraph CPU reference; supply an "
        f"implementation through the pytest_npugraph_register_ops hook")


def _f32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.to(torch.float32)


def _quant_round(y: torch.Tensor, bound: float) -> torch.Tensor:
    """Round half to even (the NPU's rint mode) and saturate to the signed range [-bound-1, bound]."""
    return torch.round(y).clamp_(-bound - 1, bound).to(torch.int8)


def _scale_values(scale: torch.Tensor) -> torch.Tensor:
    """Float scale values; an int64 scale is npu_trans_quant_param's packing (fp32 bits in the low word)."""
    if scale.dtype == torch.int64:
        low = scale & 0xFFFFFFFF
        return torch.where(low >= 2 ** 31, low - 2 ** 32, low).to(torch.int32).view(torch.float32)
    return scale.to(torch.float32)


def _stable_topk(scores: torch.Tensor, k: int):
    """Top-k along the last dim; equal scores keep the lower index first, like the NPU sort."""
    values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def _pertoken_int8(rows: torch.Tensor):
    """Symmetric per-row int8 quantisation of float32 ``rows``; returns (int8, scale)."""
    scale = rows.abs().amax(dim=-1) / 127.0
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _quant_round(rows / safe.unsqueeze(-1), 127.0), scale


# ----------------------------------------------------------------------------- int4 packing
_NIBBLE_SHIFTS = torch.arange(8, dtype=torch.int64) * 4


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Pack signed int4 values (last dim divisible by 8) into int32, element j in bits 4j..4j+3.

    This is the layout of ``npu_dynamic_quant(dst_type=torch.quint4x2)`` and of the int32 "int4"
    operands of ``npu_quant_matmul`` (little-endian nibbles, as ``npu_quantize`` produces).
    """
    nibbles = values.to(torch.int64).reshape(*values.shape[:-1], values.shape[-1] // 8, 8) & 0xF
    words = (nibbles << _NIBBLE_SHIFTS).sum(dim=-1)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int32 (..., n) -> int8 (..., 8n) with values in [-8, 7]."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    nibbles = (words.unsqueeze(-1) >> _NIBBLE_SHIFTS) & 0xF
    nibbles = torch.where(nibbles >= 8, nibbles - 16, nibbles)
    return nibbles.reshape(*packed.shape[:-1], packed.shape[-1] * 8).to(torch.int8)

