"""MX (microscaling) quantisation: npu_dynamic_mx_quant.

Follows torch_npu 2.14.0's docstring of ``npu_dynamic_mx_quant``, the CANN doc of the kernel
(aclnnDynamicMxQuant, Ascend 950) and the wheel's meta registration (shapes, argument errors).  Along
``axis``, every ``block_size`` values share one power-of-two scale stored as float8_e8m0fnu (its biased
exponent byte; torch_npu returns it as uint8)::

    scale_alg 0 (OCP MX):  shared_exp = floor(log2(max|V|)) - emax(dst);  mxscale = 2 ** shared_exp
    scale_alg 1 (FP8 only): S = max(max|V|, max_low_bound) / max(dst); mxscale = S rounded up to a power of 2
    y = cast(V / mxscale, round_mode)

``emax`` is the exponent of the destination's largest normal: FP4 E2M1 2, FP4 E1M2 0, FP8 E4M3FN 8,
FP8 E5M2 15.  The cast saturates to the destination's largest finite value (as the OCP spec's
conversions do).  An all-zero block gets the smallest scale (byte 0); a block holding inf/NaN the
E8M0 NaN byte (255).  FP4 results are packed two per uint8 along the last dim, the even element in
the low nibble (``torch_npu.float4_e2m1fn_x2``'s layout).  The scales along ``axis`` are padded to an
even count with byte 0 and stored in pairs: ``mxscale[..., j, ..., t]`` is block ``2j + t``.
``scale_alg=2`` and ``dst_type_max`` (the V3 kernel's FP4 scale algorithm) are not emulated.
"""
from __future__ import annotations

import math

import torch

from ._common import FLOAT4_E1M2FN_X2, FLOAT4_E2M1FN_X2, _check, _unsupported
from .spec import OpSpec, generated, vector

# dst_type -> name; torch.float8_* arrive as their ScalarType numbers (23, 24), torch_npu's as 291, 292.
_DST = {23: "e5m2", 291: "e5m2", 24: "e4m3fn", 292: "e4m3fn", FLOAT4_E2M1FN_X2: "e2m1", FLOAT4_E1M2FN_X2: "e1m2"}
_EMAX = {"e2m1": 2, "e1m2": 0, "e4m3fn": 8, "e5m2": 15}
_MAX = {"e2m1": 6.0, "e1m2": 1.75, "e4m3fn": 448.0, "e5m2": 57344.0}
_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# FP4 magnitudes by code (the sign is bit 3): E2M1 = 1 exponent bit pair + 1 mantissa bit, E1M2 = 1 + 2.
_FP4_GRID = {"e2m1": (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
             "e1m2": (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75)}
_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_OP = "npu_dynamic_mx_quant"


def _dst_name(dst_type) -> str:
    code = dst_type if isinstance(dst_type, int) else None
    if isinstance(dst_type, torch.dtype):
        code = {torch.float8_e5m2: 23, torch.float8_e4m3fn: 24}.get(dst_type)
    _check(code in _DST, lambda: f"{_OP}: dst_type {dst_type} is not supported (torch.float8_e5m2 / 291, "
                                 f"torch.float8_e4m3fn / 292, torch_npu.float4_e2m1fn_x2 (296), "
                                 f"torch_npu.float4_e1m2fn_x2 (297))")
    return _DST[code]


def _round(y: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "rint":
        return torch.round(y)                              # half to even
    if mode == "floor":
        return torch.floor(y)
    return torch.sign(y) * torch.floor(y.abs() + 0.5)      # "round": half away from zero


def _to_fp4_codes(y: torch.Tensor, dst: str, mode: str) -> torch.Tensor:
    """float32 values (already scaled) -> 4-bit codes (int64 0..15), saturating to the largest magnitude."""
    grid = torch.tensor(_FP4_GRID[dst], dtype=torch.float32)
    # The spacing of representable magnitudes: E2M1 0.5 below 2, 1 in [2, 4), 2 from 4; E1M2 0.25 throughout.
    mag = y.abs()
    if dst == "e2m1":
        unit = torch.where(mag < 2, 0.5, torch.where(mag < 4, 1.0, 2.0))
    else:
        unit = torch.full_like(y, 0.25)
    rounded = _round(y / unit, mode) * unit
    rounded = rounded.clamp(-_MAX[dst], _MAX[dst])
    magnitude = rounded.abs()
    codes = (magnitude.unsqueeze(-1) == grid).to(torch.int64).argmax(dim=-1)
    negative = torch.signbit(rounded).to(torch.int64)     # a negative value rounding to zero gives -0
    return codes | (negative << 3)


def _pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    pairs = codes.reshape(*codes.shape[:-1], codes.size(-1) // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def npu_dynamic_mx_quant(input: torch.Tensor, *, axis: int = -1, round_mode: str = "rint", dst_type: int = 296,
                         block_size: int = 32, scale_alg=0, dst_type_max: float = 0.0, max_low_bound: float = 0.0):
    dims = input.dim()
    if axis < -dims or axis >= dims:
        raise RuntimeError(f"Parameter axis is out of input dimension range [{-dims}, {dims - 1}]")
    if not (block_size % 32 == 0 and 0 < block_size <= 1024):
        raise RuntimeError("Parameter block_size must be divisible by 32 and no greater than 1024, greater than 0")
    alg = 0 if scale_alg is None else scale_alg
    if alg not in (0, 1, 2):
        raise RuntimeError("Invalid scale_alg value: {scale_alg}. Expected 0 or 1.")   # the wheel's text, verbatim
    dst = _dst_name(dst_type)
    if dst in ("e2m1", "e1m2") and input.size(-1) % 2:
        raise RuntimeError("If output dtype is float4_e2m1 or float4_e1m2, the last dim of input must be divisible "
                           "by 2, ")
    _check(1 <= dims <= 7, lambda: f"{_OP}: input must have 1 to 7 dims, but got {dims}")
    _check(input.dtype in _INPUT_DTYPES,
           lambda: f"{_OP}: input dtype must be float16, bfloat16 or float32, but got {input.dtype}")
    axis = axis % dims
    if input.dtype == torch.float32:
        _check(block_size == 32 and input.size(axis) >= 32,
               lambda: f"{_OP}: a float32 input needs block_size 32 and at least 32 values along the axis, but got "
                       f"block_size {block_size} and {input.size(axis)} values")
    _check(round_mode in ("rint", "floor", "round") if dst in ("e2m1", "e1m2") else round_mode == "rint",
           lambda: f"{_OP}: round_mode {round_mode!r} is not supported for this dst_type (FP8: 'rint'; FP4: "
                   f"'rint', 'floor', 'round')")
    allowed = {"e1m2": (0,), "e2m1": (0, 2), "e4m3fn": (0, 1), "e5m2": (0, 1)}[dst]
    _check(alg in allowed, lambda: f"{_OP}: scale_alg {alg} is not supported for this dst_type (allowed: {allowed})")
    _check(max_low_bound >= 0.0 and (alg == 1 or max_low_bound == 0.0),
           lambda: f"{_OP}: max_low_bound must be non-negative, and 0.0 unless scale_alg is 1, but got {max_low_bound}")
    if alg == 2 or dst_type_max != 0.0:
        raise _unsupported(_OP, "scale_alg=2 / dst_type_max (the V3 kernel's FP4 scale algorithm)")

    return mx_quantize(input.to(torch.float32), axis, dst, block_size, alg, round_mode, max_low_bound)


def mx_quantize(x: torch.Tensor, axis: int, dst: str, block_size: int = 32, alg: int = 0, round_mode: str = "rint",
                max_low_bound: float = 0.0):
    """The MX quantisation of float32 ``x`` along ``axis`` (no argument checks): ``(y, mxscale)``, ``dst`` one of
    "e4m3fn", "e5m2" (y in that float8 dtype), "e2m1", "e1m2" (y packed uint8)."""
    axis = axis % x.dim()
    x = x.movedim(axis, -1)
    n = x.size(-1)
    blocks = math.ceil(n / block_size)
    padded = torch.nn.functional.pad(x, (0, blocks * block_size - n))
    grouped = padded.reshape(*x.shape[:-1], blocks, block_size)
    amax = grouped.abs().amax(dim=-1)
    if alg == 0:
        _, exponent = torch.frexp(amax)                        # amax = m * 2**exponent, m in [0.5, 1)
        shared = (exponent - 1 - _EMAX[dst]).to(torch.float32)
    else:
        amax = torch.clamp(amax, min=max_low_bound)
        mantissa, exponent = torch.frexp(amax / _MAX[dst])
        shared = torch.where(mantissa == 0.5, exponent - 1, exponent).to(torch.float32)   # round up to 2**k
    shared = torch.where(amax == 0, torch.full_like(shared, -127.0), shared).clamp(-127.0, 127.0)
    biased = (shared + 127).to(torch.int64)
    bad = ~torch.isfinite(amax)
    biased = torch.where(bad, torch.full_like(biased, 255), biased)
    scaled = grouped / torch.exp2(shared).unsqueeze(-1)
    scaled = scaled.reshape(*x.shape[:-1], blocks * block_size)[..., :n].movedim(-1, axis)
    if dst in _FP8:
        limit = _MAX[dst]
        y = torch.where(torch.isnan(scaled), scaled, scaled.clamp(-limit, limit)).to(_FP8[dst])
    else:
        y = _pack_fp4(_to_fp4_codes(scaled, dst, round_mode))
    pairs = math.ceil(blocks / 2)
    biased = torch.nn.functional.pad(biased, (0, 2 * pairs - blocks))
    mxscale = biased.reshape(*x.shape[:-1], pairs, 2).movedim(-2, axis).to(torch.uint8).contiguous()
    return y, mxscale



def _mx_output_meta(input, dst_type):
    """The quantised output's shape and dtype: FP8 keeps the input's shape, FP4 packs two values a byte
    along the last dim (which must be even)."""
    dst = _dst_name(dst_type)
    if dst in _FP8:
        return torch.empty_like(input, dtype=_FP8[dst])
    if input.size(-1) % 2:
        raise RuntimeError("If output dtype is float4_e2m1 or float4_e1m2, the last dim of input must be "
                           "divisible by 2, ")
    return input.new_empty([*input.shape[:-1], input.size(-1) // 2], dtype=torch.uint8)


def _dynamic_mx_quant_meta(input, *, axis=-1, round_mode="rint", dst_type=296, block_size=32, scale_alg=0,
                           dst_type_max=0.0, max_low_bound=0.0):
    dims = input.dim()
    if axis < -dims or axis >= dims:
        raise RuntimeError(f"Parameter axis is out of input dimension range [{-dims}, {dims - 1}]")
    if not (block_size % 32 == 0 and 0 < block_size <= 1024):
        raise RuntimeError("Parameter block_size must be divisible by 32 and no greater than 1024, greater than 0")
    if (0 if scale_alg is None else scale_alg) not in (0, 1, 2):
        raise RuntimeError("Invalid scale_alg value: {scale_alg}. Expected 0 or 1.")
    axis = axis % dims
    scale_shape = list(input.shape) + [2]
    scale_shape[axis] = math.ceil(math.ceil(input.size(axis) / block_size) / 2)
    return _mx_output_meta(input, dst_type), input.new_empty(scale_shape, dtype=torch.uint8)


# ------------------------------------------------------------------ RMSNorm fused with MX quantisation
def _rms_mx(op, x, gamma, beta, epsilon, scale_alg, round_mode, dst_type):
    """(y, mxscale, rstd): RMSNorm over gamma's dims (``x * rstd * gamma (+ beta)``, float32), then
    ``npu_dynamic_mx_quant`` of the result along the last dim with 32-value blocks."""
    if scale_alg not in (0, 1):
        raise RuntimeError(f"Invalid scale_alg value: {scale_alg}. Expected 0 or 1.")
    dst = _dst_name(dst_type)
    if dst in ("e2m1", "e1m2") and x.size(-1) % 2:
        raise RuntimeError("If output dtype is float4_e2m1 or float4_e1m2, the last dim of input must be divisible "
                           "by 2, ")
    _check(x.dtype in (torch.float16, torch.bfloat16),
           lambda: f"{op}: x must be float16 or bfloat16, but got {x.dtype}")
    _check(gamma.dim() >= 1 and tuple(x.shape[x.dim() - gamma.dim():]) == tuple(gamma.shape),
           lambda: f"{op}: gamma {list(gamma.shape)} must match the trailing dims of x {list(x.shape)}")
    allowed = {"e1m2": (0,), "e2m1": (0,), "e4m3fn": (0, 1), "e5m2": (0, 1)}[dst]
    _check(scale_alg in allowed, lambda: f"{op}: scale_alg {scale_alg} is not supported for this dst_type")
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    normed = xf * rstd * gamma.float()
    if beta is not None:
        normed = normed + beta.float()
    normed = normed.to(x.dtype).float()                 # the kernel quantises the normalised x in x's dtype
    y, mxscale = mx_quantize(normed, -1, dst, 32, scale_alg, round_mode)
    return y, mxscale, rstd


def npu_rms_norm_dynamic_mx_quant(x, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint",
                                  dst_type=296):
    return _rms_mx("npu_rms_norm_dynamic_mx_quant", x, gamma, beta, epsilon, scale_alg, round_mode, dst_type)


def npu_add_rms_norm_dynamic_mx_quant(x1, x2, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint",
                                      dst_type=296):
    op = "npu_add_rms_norm_dynamic_mx_quant"
    _check(x1.shape == x2.shape and x1.dtype == x2.dtype,
           lambda: f"{op}: x1 and x2 must have the same shape and dtype, but got {x1.dtype} {list(x1.shape)} and "
                   f"{x2.dtype} {list(x2.shape)}")
    x_out = (x1.float() + x2.float()).to(x1.dtype)
    y, mxscale, rstd = _rms_mx(op, x_out, gamma, beta, epsilon, scale_alg, round_mode, dst_type)
    return y, x_out, mxscale, rstd


def _rms_mx_meta(x, gamma, scale_alg, dst_type):
    if scale_alg not in (0, 1):
        raise RuntimeError(f"Invalid scale_alg value: {scale_alg}. Expected 0 or 1.")
    y = _mx_output_meta(x, dst_type)
    mxscale = x.new_empty([*x.shape[:-1], math.ceil(x.size(-1) / 64), 2], dtype=torch.uint8)
    lead = x.dim() - gamma.dim()
    rstd = x.new_empty([x.size(i) if i < lead else 1 for i in range(x.dim())], dtype=torch.float32)
    return y, mxscale, rstd


SPECS = [
    OpSpec(generated("npu_rms_norm_dynamic_mx_quant"), npu_rms_norm_dynamic_mx_quant, vector(),
           meta=lambda x, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint", dst_type=296:
           _rms_mx_meta(x, gamma, scale_alg, dst_type)),
    OpSpec(generated("npu_add_rms_norm_dynamic_mx_quant"), npu_add_rms_norm_dynamic_mx_quant, vector(),
           meta=lambda x1, x2, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint", dst_type=296:
           (lambda y, s, r: (y, torch.empty_like(x1), s, r))(*_rms_mx_meta(x1, gamma, scale_alg, dst_type))),
    OpSpec(generated("npu_dynamic_mx_quant"), npu_dynamic_mx_quant, vector(), meta=_dynamic_mx_quant_meta),
]
