"""Quantisation: npu_dynamic_quant, npu_quant_matmul, npu_quantize, npu_anti_quant,
npu_dynamic_quant_asymmetric, npu_weight_quant_batchmatmul, npu_dequant_swiglu_quant, npu_kronecker_quant
(FlatQuant's rotation + per-token int4 quantisation), npu_convert_weight_to_int4pack.

Formulas follow torch_npu 2.14.0's docstrings (``_op_plugin_docs.py``) and the CANN aclnn docs of the
same kernels; shapes and argument checks the wheel's meta registrations.  Quantised values round half
to even (the NPU's rint) and saturate; an int32 tensor standing for int4 holds eight nibbles per word
(``_common.pack_int4``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ._common import (_DTYPE_MAX, FLOAT4_E2M1FN_X2, HIFLOAT8, _check, _dtype_of, _dtype_str, _quant_round, _scale_values,
                      _unsupported, pack_int4, unpack_int4)
from .layout import _tag, storage_format
from .mxquant import mx_quantize
from .spec import OpSpec, cores, generated, mix, vector


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


# ScalarType numbers of the quantised dtypes (TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP).
_QUANT_ENUMS = {0: torch.uint8, 1: torch.int8, 3: torch.int32, 12: torch.qint8, 13: torch.quint8,
                14: torch.qint32, 16: torch.quint4x2, 21: torch.bits8, 23: torch.float8_e5m2,
                24: torch.float8_e4m3fn}
_RANGES = {torch.int8: (-128.0, 127.0), torch.uint8: (0.0, 255.0), torch.int32: (-2.0 ** 31, 2.0 ** 31 - 1),
           torch.quint4x2: (-8.0, 7.0)}


def _saturate(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round half to even, clamp to ``dtype``'s range and store (int4 packed into int32)."""
    lo, hi = _RANGES[dtype]
    q = torch.round(y.to(torch.float64)).clamp_(lo, hi)
    if dtype == torch.quint4x2:
        return pack_int4(q.to(torch.int8))
    return q.to(dtype)


def _group_rows(rows: int, group_index: torch.Tensor) -> torch.Tensor:
    """Group of each row for cumulative row ends ``group_index`` (rows past the last end: last group)."""
    ends = group_index.to(torch.int64).reshape(-1)
    return torch.searchsorted(ends, torch.arange(rows), right=True).clamp_(max=ends.numel() - 1)


# ----------------------------------------------------------------------------- npu_quantize
def _quantize_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return _QUANT_ENUMS.get(int(dtype), torch.int8)


def _storage(dtype: torch.dtype) -> torch.dtype:
    """What the quantised values are stored as: qint8 -> int8, quint8 -> uint8, qint32 -> int32."""
    return {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}.get(dtype, dtype)


def _along(t: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    """A 1-D scale/offset laid along ``axis`` of ``x`` (size 1 broadcasts); N-D ones broadcast as is."""
    if t.dim() != 1:
        return t.to(torch.float32)
    shape = [1] * x.dim()
    shape[axis] = t.numel()
    return t.to(torch.float32).reshape(shape)


def npu_quantize(self: torch.Tensor, scales: torch.Tensor, zero_points: Optional[torch.Tensor], dtype: int,
                 axis: int = 1, div_mode: bool = True) -> torch.Tensor:
    """``y = round(x / scales + zero_points)`` (``x * scales`` when ``div_mode`` is False), saturated.

    1-D ``scales``/``zero_points`` lie along ``axis`` (size 1 broadcasts); with ``div_mode``
    False, ``axis`` -2 means the second last dim and any larger value the last dim.  ``dtype``
    qint8/int8, quint8/uint8, qint32/int32 or quint4x2 (int4 packed into int32 along the last dim).
    """
    target = _storage(_quantize_dtype(dtype))
    if target == torch.quint4x2:
        _check(self.size(-1) % 8 == 0, "If dtype is quint4x2, the last dim of input must be divided by 8")
    if target not in _RANGES:
        raise _unsupported("npu_quantize", f"dtype {_dtype_str(dtype)}")
    if not div_mode:
        axis = -2 if axis == -2 else -1
    axis = axis % self.dim() if self.dim() else 0
    x = self.to(torch.float32)
    s = _along(scales, x, axis)
    y = x / s if div_mode else x * s
    if zero_points is not None:
        y = y + _along(zero_points, x, axis)
    return _saturate(y, target)


def _quantize_meta(self, scales, zero_points, dtype, axis=1, div_mode=True):
    target = _storage(_quantize_dtype(dtype))
    if not isinstance(dtype, torch.dtype) and int(dtype) == HIFLOAT8:
        return self.new_empty(self.shape, dtype=torch.bits8)
    if target == torch.quint4x2:
        _check(self.size(-1) % 8 == 0, "If dtype is quint4x2, the last dim of input must be divided by 8")
        return self.new_empty((*self.shape[:-1], self.size(-1) // 8), dtype=torch.int32)
    if target not in (torch.uint8, torch.int32, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2):
        target = torch.int8
    return self.new_empty(self.shape, dtype=target)


# ----------------------------------------------------------------------------- npu_anti_quant
_FLOAT8 = (torch.float8_e5m2, torch.float8_e4m3fn, torch.uint8)


def npu_anti_quant(x: torch.Tensor, scale: torch.Tensor, *, offset: Optional[torch.Tensor] = None,
                   dst_dtype: Optional[int] = None, src_dtype: Optional[int] = None) -> torch.Tensor:
    """``y = (x + offset) * scale`` cast to ``dst_dtype`` (default float16).

    ``scale``/``offset`` are 1-D over the last dim (or size 1); an int32 ``x`` is packed int4,
    so the output's last dim is eight times x's.
    """
    _anti_quant_checks(x, scale, offset)
    if x.dtype == torch.uint8:
        raise _unsupported("npu_anti_quant", "hifloat8 x")
    values = unpack_int4(x) if x.dtype == torch.int32 else x
    y = values.to(torch.float32)
    if offset is not None:
        y = y + offset.to(torch.float32)
    return (y * scale.to(torch.float32)).to(_dtype_of(dst_dtype) or torch.float16)


def _anti_quant_checks(x, scale, offset) -> None:
    if x.dtype in _FLOAT8 and (scale.dtype != torch.float32 or (offset is not None and offset.dtype != torch.float32)):
        raise RuntimeError("When x datatype is hifloat8, float8_e5m2 or float8_e4m3fn, scale_dtype and offset_dtype "
                           "is only support float32")
    if x.dtype == torch.int32 and x.dim() == 0:
        raise RuntimeError("Not supported for x is scalar when x dtype is int32")


def _anti_quant_meta(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    _anti_quant_checks(x, scale, offset)
    dtype = _dtype_of(dst_dtype) or torch.float16
    if x.dtype == torch.int32:
        return x.new_empty((*x.shape[:-1], x.size(-1) * 8), dtype=dtype)
    return x.new_empty(x.shape, dtype=dtype)


# ----------------------------------------------------------------------------- npu_dynamic_quant_asymmetric
def npu_dynamic_quant_asymmetric(input: torch.Tensor, *, smooth_scales: Optional[torch.Tensor] = None,
                                 group_index: Optional[torch.Tensor] = None, dst_type: Optional[int] = None,
                                 quant_mode: str = "pertoken", dst_type_max: float = 0.0):
    """Asymmetric dynamic quantisation: ``scale = (max - min) / (DST_MAX - DST_MIN)``,
    ``offset = DST_MAX - max / scale``, ``y = round(x / scale + offset)``.

    int8: DST 127/-128; int4 (quint4x2, packed into int32): 7/-8.  ``smooth_scales`` multiply x
    first (per group of rows with ``group_index``, cumulative row ends).  The reduction is each
    row ("pertoken"), the whole tensor ("pertensor") or each column over dim -2 ("perchannel").
    Returns ``(y, scale, offset)``, scale and offset float32.  A constant row has range 0: its
    scale is 0 and every value quantises to DST_MAX.
    """
    target = _dtype_of(dst_type) or torch.int8
    if target == torch.quint4x2:
        _check(input.size(-1) % 8 == 0, "If dst_dtype is quint4x2, the last dim of input must be divisible by 8")
    if target not in (torch.int8, torch.quint4x2):
        raise _unsupported("npu_dynamic_quant_asymmetric", f"dst_type {_dtype_str(dst_type)}")
    _check(quant_mode in ("pertoken", "pertensor", "perchannel"),
           lambda: f"npu_dynamic_quant_asymmetric: quant_mode must be pertoken, pertensor or perchannel, "
                       f"but got {quant_mode}")
    lo, hi = _RANGES[target]
    x = input.to(torch.float32)
    if smooth_scales is not None:
        smooth = smooth_scales.to(torch.float32)
        if group_index is not None:
            rows = x.reshape(-1, x.size(-1))
            x = (rows * smooth[_group_rows(rows.size(0), group_index)]).reshape(x.shape)
        else:
            x = x * smooth
    if quant_mode == "pertoken":
        dims = (-1,)
    elif quant_mode == "perchannel":
        dims = (-2,)
    else:
        dims = tuple(range(x.dim()))
    top, bottom = x.amax(dim=dims, keepdim=True), x.amin(dim=dims, keepdim=True)
    scale = (top - bottom) / (hi - lo)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    offset = torch.where(scale == 0, hi - top, hi - top / safe)
    y = _saturate(x / safe + offset, target)
    if quant_mode == "pertensor":
        return y, scale.reshape(1), offset.reshape(1)
    return y, scale.squeeze(dims[0]), offset.squeeze(dims[0])


def _dynamic_quant_asymmetric_meta(input, *, smooth_scales=None, group_index=None, dst_type=None,
                                   quant_mode="pertoken", dst_type_max=0.0):
    shape = list(input.shape[:-2]) + [input.size(-1) if quant_mode == "perchannel" else input.size(-2)]
    if quant_mode == "pertensor":
        stat = [1]
    else:
        stat = shape
    target = _dtype_of(dst_type) or torch.int8
    if target == torch.quint4x2:
        _check(input.size(-1) % 8 == 0, "If dst_dtype is quint4x2, the last dim of input must be divisible by 8")
        y = input.new_empty((*input.shape[:-1], input.size(-1) // 8), dtype=torch.int32)
    elif target in (torch.float8_e5m2, torch.float8_e4m3fn):
        y = input.new_empty(input.shape, dtype=target)
    else:
        y = input.new_empty(input.shape, dtype=torch.int8)
    return y, input.new_empty(stat, dtype=torch.float32), input.new_empty(stat, dtype=torch.float32)


# ----------------------------------------------------------------------------- npu_weight_quant_batchmatmul
_WQBMM = "npu_weight_quant_batchmatmul"


def _weight_values(weight: torch.Tensor) -> torch.Tensor:
    """The (K, N) integer weight: int8 as is; int32 is int4 packed along N (contiguous (K, N/8))
    or, for the transposed view of an (N, K/8) matrix, along K."""
    if weight.dtype != torch.int32:
        return weight
    if weight.is_contiguous():
        return unpack_int4(weight)
    return unpack_int4(weight.transpose(0, 1)).transpose(0, 1)


def _per_k(t: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """An antiquant scale/offset as a (K or 1, N or 1) float32 matrix (per-group rows repeated)."""
    t = t.to(torch.float32)
    if t.dim() == 1:
        return t.reshape(1, -1)
    if group_size and t.size(0) > 1:
        return t.repeat_interleave(group_size, dim=0)[:k]
    return t


def npu_weight_quant_batchmatmul(x: torch.Tensor, weight: torch.Tensor, antiquant_scale: torch.Tensor,
                                 antiquant_offset: Optional[torch.Tensor] = None,
                                 quant_scale: Optional[torch.Tensor] = None, quant_offset: Optional[torch.Tensor] = None,
                                 bias: Optional[torch.Tensor] = None, antiquant_group_size: int = 0,
                                 inner_precise: int = 0, weight_dtype: Optional[int] = None) -> torch.Tensor:
    """Weight-only quantised matmul: ``y = x @ ((weight + antiquant_offset) * antiquant_scale) + bias``.

    antiquant per tensor ((1,)/(1,1)), per channel ((N,)/(1,N)) or per group
    ((ceil(K/group), N) with ``antiquant_group_size``).  With ``quant_scale`` the output is int8:
    ``round(y * quant_scale + quant_offset)`` (an int64 quant_scale is npu_trans_quant_param's
    packing); otherwise it has x's dtype.  ``inner_precise`` is a speed/precision hint, ignored.
    """
    if weight_dtype is not None or weight.dtype not in (torch.int8, torch.int32):
        raise _unsupported(_WQBMM, f"weight dtype {weight.dtype} / weight_dtype {_dtype_str(weight_dtype)}")
    if antiquant_scale.dtype == torch.int64:
        raise _unsupported(_WQBMM, "int64 (packed) antiquant_scale")
    w = _weight_values(weight).to(torch.float32)
    k = w.size(0)
    _check(x.size(-1) == k, lambda: f"{_WQBMM}: the K of x ({x.size(-1)}) and weight ({k}) must be equal")
    if antiquant_offset is not None:
        w = w + _per_k(antiquant_offset, k, antiquant_group_size)
    w = w * _per_k(antiquant_scale, k, antiquant_group_size)
    y = x.to(torch.float32) @ w
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(-1)
    if quant_scale is None:
        return y.to(x.dtype)
    y = y * _scale_values(quant_scale).reshape(-1)
    if quant_offset is not None:
        y = y + quant_offset.to(torch.float32).reshape(-1)
    return _quant_round(y, 127.0)


def _weight_quant_batchmatmul_meta(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                   quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                   weight_dtype=None):
    if weight.dtype in (torch.int32, torch.float32) and weight.is_contiguous():
        n = weight.size(1) * 8
    else:
        n = weight.size(1)
    return x.new_empty((x.size(0), n), dtype=torch.int8 if quant_scale is not None else x.dtype)


# ----------------------------------------------------------------------------- npu_dequant_swiglu_quant
_DSQ = "npu_dequant_swiglu_quant"


def _swiglu(v: torch.Tensor, activate_left: bool, swiglu_mode: int, clamp_limit: float, glu_alpha: float,
            glu_bias: float) -> torch.Tensor:
    if swiglu_mode == 1:   # GPT-OSS variant: gate = even columns, linear = odd columns
        gate = v[..., 0::2].clamp(max=clamp_limit)
        linear = v[..., 1::2].clamp(min=-clamp_limit, max=clamp_limit)
        return gate * torch.sigmoid(glu_alpha * gate) * (linear + glu_bias)
    first, second = v.chunk(2, dim=-1)
    if activate_left:
        return torch.nn.functional.silu(first) * second
    return torch.nn.functional.silu(second) * first


def npu_dequant_swiglu_quant(x: torch.Tensor, *, weight_scale: Optional[torch.Tensor] = None,
                             activation_scale: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                             quant_scale: Optional[torch.Tensor] = None, quant_offset: Optional[torch.Tensor] = None,
                             group_index: Optional[torch.Tensor] = None, activate_left: bool = False,
                             quant_mode: int = 0, dst_type: Optional[int] = None, round_mode: Optional[int] = None,
                             activate_dim: Optional[int] = None, swiglu_mode: int = 0, clamp_limit: float = 7.0,
                             glu_alpha: float = 1.702, glu_bias: float = 1.0):
    """Dequantise the int32 matmul output, SwiGLU, then dynamic per-row int8 quantisation.

    ``v = (x + bias) * weight_scale[group] * activation_scale[row]`` (int32 x; float x is used
    as is); ``s = swiglu(v)`` (``activate_left``: silu(first half) * second half, else
    silu(second half) * first half; ``swiglu_mode`` 1: the clamped GPT-OSS variant on the
    even/odd columns); ``t = s * quant_scale[group]``; ``scale = rowmax|t| / 127``;
    ``y = round(t / scale)``.  ``group_index`` holds per-group row counts; rows past their sum
    are left zero (the kernel leaves them unwritten).  Static quantisation (quant_mode 0) is
    not modelled.
    """
    if quant_mode != 1:
        raise _unsupported(_DSQ, "static quantisation (quant_mode=0)")
    for name, value in (("dst_type", dst_type), ("round_mode", round_mode)):
        if value not in (None, 1 if name == "dst_type" else 0):
            raise _unsupported(_DSQ, f"{name}={value}")
    if activate_dim not in (None, -1, x.dim() - 1):
        raise _unsupported(_DSQ, f"activate_dim={activate_dim}")
    _check(x.size(-1) % 2 == 0, f"{_DSQ}: the last dim of x must be even")
    if x.dtype == torch.int32:
        _check(weight_scale is not None, f"{_DSQ}: weight_scale is required when x is int32")
    else:
        _check(weight_scale is None and activation_scale is None and bias is None,
               f"{_DSQ}: weight_scale, activation_scale and bias must be None when x is float16 or bfloat16")
    if group_index is not None:
        _check(bias is None and quant_offset is None, f"{_DSQ}: bias and quant_offset must be None with group_index")
    if bias is not None and bias.dtype != torch.int32:
        raise _unsupported(_DSQ, f"{bias.dtype} bias")
    if quant_offset is not None:
        raise _unsupported(_DSQ, "quant_offset with dynamic quantisation")
    rows = x.reshape(-1, x.size(-1))
    n = rows.size(0)
    if group_index is not None:
        counts = group_index.to(torch.int64).reshape(-1)
        group = torch.repeat_interleave(torch.arange(counts.numel()), counts)[:n]
        valid = group.numel()
        group = torch.cat((group, torch.zeros(n - valid, dtype=torch.int64)))
    else:
        group, valid = torch.zeros(n, dtype=torch.int64), n
    v = rows.to(torch.float64 if x.dtype == torch.int32 else torch.float32)
    if bias is not None:
        v = v + bias.to(torch.float64).reshape(-1)
    v = v.to(torch.float32)
    if weight_scale is not None:
        v = v * weight_scale.to(torch.float32).reshape(-1, x.size(-1))[group if weight_scale.dim() == 2
                                                                        and weight_scale.size(0) > 1 else 0]
    if activation_scale is not None:
        v = v * activation_scale.to(torch.float32).reshape(-1, 1)
    s = _swiglu(v, activate_left, swiglu_mode, clamp_limit, glu_alpha, glu_bias)
    if quant_scale is not None:
        qs = quant_scale.to(torch.float32).reshape(-1, s.size(-1))
        s = s * qs[group if qs.size(0) > 1 else torch.zeros(n, dtype=torch.int64)]
    scale = s.abs().amax(dim=-1) / 127.0
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    y = _quant_round(s / safe.unsqueeze(-1), 127.0)
    y[valid:] = 0
    scale[valid:] = 0
    return y.reshape(*x.shape[:-1], -1), scale.reshape(x.shape[:-1])


def _dequant_swiglu_quant_meta(x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None,
                               quant_offset=None, group_index=None, activate_left=False, quant_mode=0, dst_type=None,
                               round_mode=None, activate_dim=None, swiglu_mode=0, clamp_limit=7.0, glu_alpha=1.702,
                               glu_bias=1.0):
    dim = activate_dim if activate_dim is not None else -1
    dim = dim if dim >= 0 else dim + x.dim()
    y = [x.size(i) // 2 if i == dim else x.size(i) for i in range(x.dim())]
    scale = [x.size(i) // 2 if i == dim else x.size(i) for i in range(x.dim() - 1)]
    dtype = torch.uint8 if dst_type == HIFLOAT8 else (_dtype_of(dst_type) or torch.int8)
    if dtype == torch.uint8 and dst_type != HIFLOAT8:
        y[-1] = y[-1] // 2
    return x.new_empty(y, dtype=dtype), x.new_empty(scale, dtype=torch.float32)


# ----------------------------------------------------------------------------- npu_kronecker_quant
_KRONECKER_DTYPES = (torch.float16, torch.bfloat16)
_INT32_ENUM = 3


def _kronecker_dst(dst_dtype):
    """None / torch.int32 / 3 -> "int32"; torch_npu.float4_e2m1fn_x2 (296) -> "mxfp4"; else the meta's error."""
    if dst_dtype is None or dst_dtype == torch.int32 or dst_dtype == _INT32_ENUM:
        return "int32"
    if isinstance(dst_dtype, int) and dst_dtype == FLOAT4_E2M1FN_X2:
        return "mxfp4"
    raise RuntimeError("the dtype of dst_dtype must be int32, or mxfp4")


def npu_kronecker_quant(x: torch.Tensor, kronecker_p1: torch.Tensor, kronecker_p2: torch.Tensor,
                        clip_ratio: Optional[float] = None, dst_dtype: Optional[int] = None,
                        dst_type_max: Optional[float] = None):
    """FlatQuant (CANN aclnnFlatQuant, torch_npu ``npu_kronecker_quant``): ``x`` ``[K, M, N]`` is rotated
    ``x'' = P1 @ (x @ P2)`` per slice, then quantised per slice ``k`` to int4::

        quant_scale[k] = max|x''[k]| * clip_ratio / 7      (the current aclnn doc's "/ (7 / clipRatio)")
        out[k] = saturate(rint(x''[k] / quant_scale[k]), -8, 7)

    ``out`` packs eight int4 values per int32 along N (``[K, M, N/8]``, the layout ``npu_quant_matmul``
    reads); ``quant_scale`` is float32 ``[K]``.  The matmuls run in float32.

    ``dst_dtype=torch_npu.float4_e2m1fn_x2`` (aclnnFlatQuant's "pergroup" mode): ``x''`` reshaped to
    ``[K, M*N]`` is MX-quantised to FP4 E2M1 in groups of 32 (OCP scales, rint; ``mxquant.mx_quantize``):
    ``out`` uint8 ``[K, M*N/2]`` (two values per byte), ``quant_scale`` E8M0 bytes ``[K, ceil(M*N/64), 2]``;
    a ``[0, 0]`` ``kronecker_p2`` means no right matmul.
    The aclnn doc's pergroup formula has no clip ratio, so ``clip_ratio`` does not enter it; a non-zero
    ``dst_type_max`` is not emulated.
    """
    op = "npu_kronecker_quant"
    mode = _kronecker_dst(dst_dtype)
    if mode == "mxfp4":
        _check(x.dim() == 3, "the dim num of input x must be 3")
        _check(x.size(-1) % 2 == 0, lambda: f"{op}: the last dim of x must be even for float4_e2m1 output, but got "
                                            f"{x.size(-1)}")
        if dst_type_max:
            raise _unsupported(op, "dst_type_max with the float4_e2m1fn_x2 output")
    else:
        _check(x.dim() == 3, lambda: f"{op}: x must be 3-dimensional [K, M, N], but got {list(x.shape)}")
        _check(x.size(-1) % 8 == 0, "last dim of input x must be divisible by 8")
    _check(x.dtype in _KRONECKER_DTYPES, lambda: f"{op}: x dtype must be float16 or bfloat16, but got {x.dtype}")
    _check(kronecker_p1.dtype == x.dtype and kronecker_p2.dtype == x.dtype,
           lambda: f"{op}: kronecker_p1 ({kronecker_p1.dtype}) and kronecker_p2 ({kronecker_p2.dtype}) must have "
                   f"x's dtype {x.dtype}")
    m, n = x.size(1), x.size(2)
    _check(tuple(kronecker_p1.shape) == (m, m), lambda: f"{op}: kronecker_p1 must be [M, M] = {[m, m]}, but got "
                                                        f"{list(kronecker_p1.shape)}")
    left_only = mode == "mxfp4" and tuple(kronecker_p2.shape) == (0, 0)   # pergroup: [0, 0] skips the right matmul
    _check(left_only or tuple(kronecker_p2.shape) == (n, n),
           lambda: f"{op}: kronecker_p2 must be [N, N] = {[n, n]}, but got {list(kronecker_p2.shape)}")
    ratio = 1.0 if clip_ratio is None else float(clip_ratio)
    _check(0.0 < ratio <= 1.0, lambda: f"{op}: clip_ratio must be in (0, 1], but got {ratio}")
    right = x.to(torch.float32) if left_only else torch.matmul(x.to(torch.float32), kronecker_p2.to(torch.float32))
    rotated = torch.matmul(kronecker_p1.to(torch.float32), right)
    if mode == "mxfp4":
        return mx_quantize(rotated.reshape(x.size(0), m * n), -1, "e2m1")
    scale = rotated.abs().amax(dim=(1, 2)) * ratio / 7.0
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(rotated / safe.reshape(-1, 1, 1)).clamp_(-8, 7).to(torch.int8)
    return pack_int4(q), scale


def _kronecker_quant_meta(x, kronecker_p1, kronecker_p2, clip_ratio=None, dst_dtype=None, dst_type_max=None):
    if _kronecker_dst(dst_dtype) == "mxfp4":
        _check(x.dim() == 3, "the dim num of input x must be 3")
        cols = x.size(-1) * x.size(-2)
        return (x.new_empty([x.size(0), cols // 2], dtype=torch.uint8),
                x.new_empty([x.size(0), (cols + 63) // 64, 2], dtype=torch.uint8))
    _check(x.size(-1) % 8 == 0, "last dim of input x must be divisible by 8")
    return (x.new_empty([*x.shape[:-1], x.size(-1) // 8], dtype=torch.int32),
            x.new_empty([x.size(0)], dtype=torch.float32))


# ----------------------------------------------------------------------------- npu_convert_weight_to_int4pack
_FRACTAL_NZ = 29
# How TORCH_CHECK prints a tensor's dtype (caffe2::TypeMeta names, GCC spelling).
_TYPEMETA_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
                   torch.bfloat16: "c10::BFloat16", torch.int8: "signed char", torch.uint8: "unsigned char",
                   torch.int16: "short int", torch.int64: "long int", torch.bool: "bool"}


def npu_convert_weight_to_int4pack(weight: torch.Tensor, inner_k_tiles: int = 0) -> torch.Tensor:
    """Eight consecutive int4 values of the last dim in one int32, the first in the lowest nibble:
    ``(k, n)`` int32 -> ``(k, n/8)`` int32, the layout ``npu_weight_quant_batchmatmul`` and
    ``npu_quant_matmul`` read (``_common.pack_int4``).  As torch_npu's host-side packing, each value
    contributes its low four bits (values outside [-8, 7] wrap); ``inner_k_tiles`` is reserved (unused).
    A FRACTAL_NZ weight gives a FRACTAL_NZ result (values stay in logical order on the emulated device).
    Argument checks and messages are torch_npu's (``int4pack_params_check``).
    """
    _check(weight.is_contiguous(), "weight should be contiguous")
    _check(weight.dim() == 2, lambda: f"weight shape only support dim num 2, but it is {weight.dim()}")
    _check(weight.dtype == torch.int32, lambda: "weight dtype only support int32, but it is "
                                                + _TYPEMETA_NAMES.get(weight.dtype, str(weight.dtype)))
    _check(weight.size(0) > 0 and weight.size(1) > 0, "weight dim should be greater than 0")
    _check(weight.size(1) % 8 == 0, lambda: f"weight last dim should be the multiple of 8, but it is {weight.size(1)}")
    packed = pack_int4(weight)
    return _tag(packed, _FRACTAL_NZ) if storage_format(weight) == _FRACTAL_NZ else packed


def _convert_weight_to_int4pack_meta(weight, inner_k_tiles=0):
    _check(weight.dim() == 2, lambda: f"weight shape only support dim num 2, but it is {weight.dim()}")
    _check(weight.size(1) % 8 == 0, lambda: f"weight last dim should be the multiple of 8, but it is {weight.size(1)}")
    return weight.new_empty([weight.size(0), weight.size(1) // 8], dtype=torch.int32)


SPECS = [
    OpSpec("npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
           "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)",
           npu_dynamic_quant, vector()),
    OpSpec("npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
           "Tensor? pertoken_scale=None, Tensor? bias=None, int? output_dtype=None, int? x1_dtype=None, "
           "int? x2_dtype=None, int? pertoken_scale_dtype=None, int? scale_dtype=None, int[]? group_sizes=None, "
           "Tensor? y_scale=None) -> Tensor", npu_quant_matmul, mix()),
    OpSpec("npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, int axis=1, "
           "bool div_mode=True) -> Tensor", npu_quantize, vector(), meta=_quantize_meta),
    OpSpec("npu_anti_quant(Tensor x, Tensor scale, *, Tensor? offset=None, int? dst_dtype=None, "
           "int? src_dtype=None) -> Tensor", npu_anti_quant, vector(), meta=_anti_quant_meta),
    OpSpec("npu_dynamic_quant_asymmetric(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
           "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor, Tensor)",
           npu_dynamic_quant_asymmetric, vector(), meta=_dynamic_quant_asymmetric_meta),
    # Antiquant runs on the vector cores, the matmul on the cube cores: a mixed kernel.
    OpSpec("npu_weight_quant_batchmatmul(Tensor x, Tensor weight, Tensor antiquant_scale, "
           "Tensor? antiquant_offset=None, Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? bias=None, "
           "int antiquant_group_size=0, int inner_precise=0, int? weight_dtype=None) -> Tensor",
           npu_weight_quant_batchmatmul, mix(), meta=_weight_quant_batchmatmul_meta),
    OpSpec("npu_dequant_swiglu_quant(Tensor x, *, Tensor? weight_scale=None, Tensor? activation_scale=None, "
           "Tensor? bias=None, Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? group_index=None, "
           "bool activate_left=False, int quant_mode=0, int? dst_type=None, int? round_mode=None, "
           "int? activate_dim=None, int swiglu_mode=0, float clamp_limit=7.0, float glu_alpha=1.702, "
           "float glu_bias=1.0) -> (Tensor, Tensor)", npu_dequant_swiglu_quant, vector(),
           meta=_dequant_swiglu_quant_meta),
    # Two small matmuls on the cube cores, the quantisation on the vector cores.
    OpSpec(generated("npu_kronecker_quant"), npu_kronecker_quant, mix(), meta=_kronecker_quant_meta),
    # torch_npu packs on the host (device -> host copy, CPU loop, host -> device copy): no AI Core kernel.
    OpSpec(generated("npu_convert_weight_to_int4pack"), npu_convert_weight_to_int4pack,
           cores("AICPU", limit_applies=False), meta=_convert_weight_to_int4pack_meta),
]
