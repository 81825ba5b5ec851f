"""Quantisation: npu_dynamic_quant, npu_quant_matmul."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ._common import (_DTYPE_MAX, _check, _dtype_of, _dtype_str, _quant_round, _scale_values, _unsupported, pack_int4,
                      unpack_int4)
from .spec import OpSpec, mix, vector


# ----------------------------------------------------------------------------- quantisation
def npu_dynamic_quant(input: torch.Tensor, *, smooth_scales: Optional[torch.Tensor] = None,
                      group_index: Optional[torch.Tensor] = None, dst_type: Optional[int] = None,
                      quant_mode: str = "pertoken", dst_type_max: float = 0.0):
    """Symmetric dynamic quantisation: ``scale = max|x*smooth| / DTYPE_MAX``, ``y = round(x*smooth/scale)``.

    ``quant_mode`` picks the reduction: "pertoken" (each row of the last dim), "pertensor" (one
    scale) or "perchannel" (each column over dim -2).  With ``group_index`` (MoE), row r of the
    flattened input uses ``smooth_scales[g]`` for the group whose cumulative end first exceeds r.
    """
    target = _dtype_of(dst_type) or torch.int8
    hidden = input.size(-1)
    if target == torch.quint4x2:
        _check(hidden % 8 == 0, "If dst_dtype is quint4x2, the last dim of input must be divisible by 8")
    if target not in _DTYPE_MAX:
        raise _unsupported("npu_dynamic_quant", f"dst_type {_dtype_str(dst_type)}")
    if quant_mode not in ("pertoken", "pertensor", "perchannel"):
        raise RuntimeError(f"npu_dynamic_quant: quant_mode must be pertoken, pertensor or perchannel, but got {quant_mode}")
    x = input.to(torch.float32)
    if smooth_scales is not None:
        smooth = smooth_scales.to(torch.float32)
        if group_index is not None:
            rows = x.reshape(-1, hidden)
            ends = group_index.to(torch.int64)
            group = torch.searchsorted(ends, torch.arange(rows.size(0)), right=True).clamp_(max=ends.numel() - 1)
            x = (rows * smooth[group]).reshape(x.shape)
        else:
            x = x * smooth
    bound = float(dst_type_max) if dst_type_max > 0 and target.is_floating_point else _DTYPE_MAX[target]
    if quant_mode == "pertoken":
        amax = x.abs().amax(dim=-1, keepdim=True)
    elif quant_mode == "pertensor":
        amax = x.abs().amax().reshape([1] * x.dim())
    else:
        amax = x.abs().amax(dim=-2, keepdim=True)
    scale = amax / bound
    scaled = x / torch.where(scale == 0, torch.ones_like(scale), scale)
    if target.is_floating_point:
        y = scaled.clamp(-bound, bound).to(target)
    else:
        y = _quant_round(scaled, bound)
        if target == torch.quint4x2:
            y = pack_int4(y)
    if quant_mode == "pertoken":
        scale = scale.squeeze(-1)
    elif quant_mode == "pertensor":
        scale = scale.reshape(1)
    else:
        scale = scale.squeeze(-2)
    return y, scale


def _unpacked_operand(t: torch.Tensor, packed_dim_is_last: bool) -> torch.Tensor:
    """A quant_matmul operand as int values: int32 means eight packed int4 along its packing axis."""
    if t.dtype != torch.int32:
        return t
    if packed_dim_is_last:
        return unpack_int4(t)
    return unpack_int4(t.transpose(-1, -2)).transpose(-1, -2)


# Output dtypes the meta kernel accepts and the reference can produce (it also accepts bits8/uint8).
_QMM_OUTPUTS = (torch.int8, torch.int32, torch.float16, torch.bfloat16, torch.float32, torch.float8_e5m2,
                torch.float8_e4m3fn)
_SCALE_HEAD = "the scale 1st dim value must be 1 or x2 n dim value, " + " " * 16 + "please check scale 1st dim value "
_OFFSET_HEAD = "the offset 1st dim value must be 1 or x2 n dim value, " + " " * 16 + "please check offset 1st dim value "


def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *, offset: Optional[torch.Tensor] = None,
                     pertoken_scale: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                     output_dtype: Optional[int] = None, x1_dtype: Optional[int] = None, x2_dtype: Optional[int] = None,
                     pertoken_scale_dtype: Optional[int] = None, scale_dtype: Optional[int] = None,
                     group_sizes: Optional[Sequence[int]] = None, y_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Quantised (batched) matmul: int accumulate, then dequantise/requantise.

    ``acc = x1 @ x2 (+ int32 bias)``; ``y = acc * scale [* pertoken_scale per row] (+ float bias)``;
    int8 output adds ``offset`` and saturates, int32 output is the raw accumulator.  Int32
    operands are packed int4; x2 may be the transposed view of an (n, k/8) packed matrix.
    """
    for name, value in (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype), ("scale_dtype", scale_dtype),
                        ("pertoken_scale_dtype", pertoken_scale_dtype), ("group_sizes", group_sizes),
                        ("y_scale", y_scale)):
        if value is not None:
            raise _unsupported("npu_quant_matmul", name)
    if x1.dtype != x2.dtype:
        raise _unsupported("npu_quant_matmul", f"mixed operands x1 {x1.dtype} x x2 {x2.dtype} (A8W4)")
    _check(2 <= x1.dim() <= 6, "x1 dim num should be 2 ~ 6, please check x1 dim num ")
    _check(2 <= x2.dim() <= 6, "x2 dim num should be 2 ~ 6 when x1's dtype is int8, "
                               + " " * 16 + "please check x2 dim num ")
    a = _unpacked_operand(x1, True)
    b = _unpacked_operand(x2, packed_dim_is_last=x1.size(-1) != x2.size(-2))
    _check(a.size(-1) == b.size(-2), "k dim of x1 and x2 need be same, please check k dim of x1 and x2 ")
    n = b.size(-1)
    _check(scale.dim() == 1, "the scale dim num must be 1, please check scale dim num ")
    _check(scale.size(0) in (1, n), _SCALE_HEAD)
    if offset is not None:
        _check(offset.dim() == 1, "the offset dim num must be 1, please check offset dim num ")
        _check(offset.size(0) in (1, n), _OFFSET_HEAD)
    if pertoken_scale is not None:
        _check(pertoken_scale.dim() == 1, "the pertoken_scale dim num must be 1, please check scale dim num ")
    try:
        torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise RuntimeError("the batch shape cannot be broadcast") from None
    if bias is not None:
        _check(bias.dim() in (1, 3), "bias_dim_num should be 1 or 3 when x1's dtype is int8, please check bias dim num ")
        _check(bias.size(-1) == n, "bias_first_dim should be equal to x2 n dim, please check bias 1st dim value ")
    out_dtype = _dtype_of(output_dtype)
    if scale.dtype == torch.bfloat16:
        _check(out_dtype in (torch.bfloat16, torch.int32),
               lambda: "When scale's dtype is bfloat16, output_dtype must be bfloat16 or int32, but output_dtype is "
               + _dtype_str(output_dtype))
    if output_dtype is None:
        out_dtype = torch.int8
    elif out_dtype not in _QMM_OUTPUTS and out_dtype not in (torch.bits8, torch.uint8):
        raise RuntimeError("Not supported output dtype is " + _dtype_str(output_dtype))
    elif out_dtype not in _QMM_OUTPUTS:
        raise _unsupported("npu_quant_matmul", f"output_dtype {_dtype_str(output_dtype)}")
    acc = a.to(torch.float64) @ b.to(torch.float64)
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias.to(torch.float64)
    if out_dtype == torch.int32:
        return acc.to(torch.int32)
    y = acc * _scale_values(scale).to(torch.float64)
    if pertoken_scale is not None:
        y = y * pertoken_scale.to(torch.float64).unsqueeze(-1)
    if bias is not None and bias.dtype != torch.int32:
        y = y + bias.to(torch.float64)
    if out_dtype == torch.int8:
        if offset is not None:
            y = y + offset.to(torch.float64)
        return _quant_round(y, 127.0)
    return y.to(out_dtype)


SPECS = [
    OpSpec("npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
           "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)",
           npu_dynamic_quant, vector()),
    OpSpec("npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
           "Tensor? pertoken_scale=None, Tensor? bias=None, int? output_dtype=None, int? x1_dtype=None, "
           "int? x2_dtype=None, int? pertoken_scale_dtype=None, int? scale_dtype=None, int[]? group_sizes=None, "
           "Tensor? y_scale=None) -> Tensor", npu_quant_matmul, mix()),
]
