"""CPU reference math for the torch_npu custom ops that LLM model code calls.

Every function here is pure (CPU tensors in, new CPU tensors out, nothing cached, no device
state), except the ops whose schema marks an argument written (``Tensor(a!)``): they update it in
place as the real kernel does.  Signatures follow the op schemas of torch_npu 2.14.0 (argument
names, order, ``*``, defaults), so ``catalog.OPS`` can hand them to ``torch.library`` unchanged.

Numerics: fp16/bf16 inputs are computed in float32 (the NPU kernels accumulate in fp32) and
cast back at the end; integer matmuls accumulate exactly in float64.  Where a meta kernel of
the real wheel raises a ``torch._check`` failure, the same message head is raised here as a
``RuntimeError`` (the ``[ERROR] ... ERR01003 OPS ...`` suffix the product appends is left out, as
with ``TORCH_NPU_COMPACT_ERROR_OUTPUT=1``).  Features the emulator does not model raise
``NotImplementedError`` (a ``RuntimeError``) naming the op and the feature.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

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
    return NotImplementedError(
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


# ----------------------------------------------------------------------------- elementwise / norms
def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``A * sigmoid(A) * B`` with A, B the first and second halves of ``self`` along ``dim``."""
    half = self.size(dim) // 2
    a = self.narrow(dim, 0, half).to(torch.float32)
    b = self.narrow(dim, half, half).to(torch.float32)
    return (F.silu(a) * b).to(self.dtype)


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """RMS norm over the trailing ``gamma.dim()`` dims; returns (y, rstd) with rstd float32."""
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    x = self.to(torch.float32)
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (x * rstd * gamma.to(torch.float32)).to(self.dtype), rstd


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """Residual add fused with RMS norm; returns (rms_norm(x1+x2)*gamma, rstd, x1+x2)."""
    total = x1.to(torch.float32) + x2.to(torch.float32)
    y, rstd = npu_rms_norm(total, gamma, epsilon)
    return y.to(x1.dtype), rstd, total.to(x1.dtype)


def npu_add_rms_norm_v2_functional(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                                   epsilon: float = 1e-06):
    """Out-of-place form of ``npu_add_rms_norm_v2``: returns (rstd, new x1, new x2).

    The order is the functional-variant convention (the op's own return, then the values of the
    mutated arguments in order): rstd float32, ``rms_norm(x1+x2)*gamma`` like x1, ``x1+x2`` like x2.
    """
    y, rstd, total = npu_add_rms_norm(x1, x2, gamma, epsilon)
    return rstd, y, total.to(x2.dtype)


def npu_add_rms_norm_v2(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """In-place ``npu_add_rms_norm``: x1 <- rms_norm(x1+x2)*gamma, x2 <- x1+x2; returns rstd only.

    Unlike the rest of this module it writes its (``Tensor(a!)``/``Tensor(b!)``) arguments.
    """
    rstd, y, total = npu_add_rms_norm_v2_functional(x1, x2, gamma, epsilon)
    x1.copy_(y)
    x2.copy_(total)
    return rstd


def npu_rotary_mul(self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half",
                   rotate: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rotary embedding ``r1*x + r2*x_new`` (r1 = cos, r2 = sin), x_new by mode or ``x @ rotate``."""
    if rotary_mode not in ("half", "interleave"):
        raise RuntimeError(f"npu_rotary_mul: rotary_mode only supports 'half' and 'interleave', but got {rotary_mode!r}")
    if self.dim() != 4:
        raise RuntimeError(f"npu_rotary_mul: input must be 4-D (BNSD, BSND or SBND), but got {self.dim()}-D")
    x = self.to(torch.float32)
    if rotate is not None:
        x_new = x @ rotate.to(torch.float32)
    elif rotary_mode == "half":
        first, second = x.chunk(2, dim=-1)
        x_new = torch.cat((-second, first), dim=-1)
    else:
        x_new = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return (r1.to(torch.float32) * x + r2.to(torch.float32) * x_new).to(self.dtype)


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


# ----------------------------------------------------------------------------- grouped matmul
_GMM = "npu_grouped_matmul"
_GMM_OUTPUT_ENUMS = (5, 15, 6, 3)  # float16, bfloat16, float32, int32


def _gmm_activation(y: torch.Tensor, act_type: int) -> torch.Tensor:
    """act_type 0 none, 1 relu, 2 gelu_tanh, 4 fast_gelu (x*sigmoid(1.702x)), 5 silu; 3 is reserved."""
    if act_type in (None, 0):
        return y
    if act_type == 1:
        return torch.relu(y)
    if act_type == 2:
        return F.gelu(y, approximate="tanh")
    if act_type == 4:
        return y * torch.sigmoid(1.702 * y)
    if act_type == 5:
        return F.silu(y)
    raise RuntimeError(f"{_GMM}: act_type {act_type} is not supported, expected 0, 1, 2, 4 or 5")


def _gmm_group_bounds(group_list, group_list_type, rows: int):
    """Row (or K) ranges of each group: group_list_type 0 = cumulative ends, 1 = per-group sizes."""
    values = [int(v) for v in group_list]
    if group_list_type == 1:
        values = [sum(values[:i + 1]) for i in range(len(values))]
    _check(all(b >= a for a, b in zip([0] + values, values)) and (not values or values[-1] <= rows),
           lambda: f"{_GMM}: group_list must be non-negative and non-decreasing with a last end <= {rows}, "
                   f"but got {list(group_list)}")
    return list(zip([0] + values[:-1], values))


class _GmmParams:
    """Per-group view of the optional Tensor[] arguments (one stacked tensor when the weight is 3-D)."""

    def __init__(self, stacked: bool, **lists):
        self.stacked = stacked
        self.lists = lists

    def get(self, name: str, g: int) -> Optional[torch.Tensor]:
        values = self.lists.get(name)
        if not values:
            return None
        return values[0][g] if self.stacked else values[g]


def _gmm_one(x: torch.Tensor, w: torch.Tensor, g: int, params: _GmmParams, token_scale, out_dtype, act_type):
    """One group's matmul in one of the four forms (float, per-channel, per-token, antiquant)."""
    bias = params.get("bias", g)
    scale = params.get("scale", g)
    if w.dtype == torch.int32:
        raise _unsupported(_GMM, "int4 (int32-packed) weight")
    if x.dtype == torch.int8 and w.dtype == torch.int8:
        y = x.to(torch.float64) @ w.to(torch.float64)
        if bias is not None:
            y = y + bias.to(torch.float64)
        if scale is not None:
            y = y * _scale_values(scale).to(torch.float64)
            if token_scale is not None:
                y = y * token_scale.to(torch.float64).unsqueeze(-1)
            offset = params.get("offset", g)
            if offset is not None:
                y = y + offset.to(torch.float64)
        y = _gmm_activation(y, act_type)
        if out_dtype == torch.int8:
            return _quant_round(y, 127.0)
        return y.to(out_dtype)
    wf = w.to(torch.float32)
    antiquant_scale = params.get("antiquant_scale", g)
    if antiquant_scale is not None:
        antiquant_offset = params.get("antiquant_offset", g)
        per_group = antiquant_scale.dim() == 2  # (G_k, n): one scale row per K block
        expand = (lambda t: t.to(torch.float32).repeat_interleave(w.size(0) // t.size(0), dim=0)) if per_group \
            else (lambda t: t.to(torch.float32))
        if antiquant_offset is not None:
            wf = wf + expand(antiquant_offset)
        wf = wf * expand(antiquant_scale)
    y = x.to(torch.float32) @ wf
    if bias is not None:
        y = y + bias.to(torch.float32)
    return _gmm_activation(y, act_type).to(out_dtype)


def _grouped_matmul(x, weight, *, group_bounds_of, split_item, group_type, act_type, out_enum, params):
    """Shared body of both overloads; ``group_bounds_of(rows)`` gives the group ranges or None."""
    _check(len(x) > 0 and len(weight) > 0, lambda: "The number of x and weight should be greater than 0, but they are "
           + str(len(x)) + "and " + str(len(weight)) + ".")
    out_dtype = _dtype_of(out_enum) if out_enum else x[0].dtype
    single_weight = len(weight) == 1 and weight[0].dim() == 3
    num_groups = weight[0].size(0) if single_weight else len(weight)
    weight_of = (lambda g: weight[0][g]) if single_weight else (lambda g: weight[g])
    token_scales = params.lists.get("per_token_scale")
    outputs = []
    if group_type == 2:  # K-axis grouping: x (M, K) and the weight split along K, y (G, M, N)
        bounds = group_bounds_of(x[0].size(1))
        _check(bounds is not None, f"{_GMM}: group_type 2 needs group_list")
        for g, (lo, hi) in enumerate(bounds):
            w = weight[0][lo:hi] if len(weight) == 1 and weight[0].dim() == 2 else weight_of(g)
            outputs.append(_gmm_one(x[0][:, lo:hi], w, g, params, None, out_dtype, act_type))
        return [torch.stack(outputs)] if split_item in (2, 3) else outputs
    if len(x) > 1:  # one x per weight ("multi-multi"); group_list, if any, must agree with the rows
        _check(len(x) == num_groups, lambda: f"{_GMM}: {len(x)} x tensors but {num_groups} weights")
        bounds = group_bounds_of(sum(t.size(0) for t in x))
        if bounds is not None:
            _check([hi - lo for lo, hi in bounds] == [t.size(0) for t in x],
                   lambda: f"{_GMM}: group_list does not match the first dims of x")
        for g, xg in enumerate(x):
            ts = token_scales[g] if token_scales else None
            outputs.append(_gmm_one(xg, weight_of(g), g, params, ts, out_dtype, act_type))
        return [torch.cat(outputs)] if split_item in (2, 3) else outputs
    rows = x[0].size(0)
    bounds = group_bounds_of(rows)
    if bounds is None:
        _check(num_groups == 1, lambda: f"{_GMM}: a single x with {num_groups} weights needs group_list")
        bounds = [(0, rows)]
    _check(len(bounds) == num_groups, lambda: f"{_GMM}: group_list has {len(bounds)} groups but there are "
           f"{num_groups} weights")
    for g, (lo, hi) in enumerate(bounds):
        ts = token_scales[0][lo:hi] if token_scales else None
        outputs.append(_gmm_one(x[0][lo:hi], weight_of(g), g, params, ts, out_dtype, act_type))
    if split_item == 1:
        return outputs
    full = x[0].new_zeros((*x[0].shape[:-1], outputs[0].size(-1)), dtype=out_dtype)
    for (lo, hi), y in zip(bounds, outputs):
        full[lo:hi] = y
    return [full]


def _gmm_entry(args: dict, list_overload: bool):
    """Checks shared by both overloads (meta kernel order), then the common body."""
    group_type, group_list = args["group_type"], args["group_list"]
    _check(group_type in (-1, 0, 2) or (list_overload and group_list is not None and group_type is None),
           lambda: f"group_type only supports -1, 0 and 2, but got {group_type} ")
    for name in ("x_dtype", "weight_dtype", "scale_dtype", "per_token_scale_dtype"):
        if args.get(name) is not None:
            raise _unsupported(_GMM, f"{name}={_dtype_str(args[name])}")
    for name in ("activation_input", "activation_quant_scale", "activation_quant_offset"):
        if args[name]:
            raise _unsupported(_GMM, name)
    out_enum = args["output_dtype"]
    out_enum = _ENUM_OF_DTYPE.get(out_enum) if isinstance(out_enum, torch.dtype) else out_enum
    if out_enum and out_enum not in _GMM_OUTPUT_ENUMS:
        raise RuntimeError("The output dtype ", str(out_enum), " is not supported for now.")
    if isinstance(group_list, torch.Tensor):
        group_list = group_list.tolist()
    list_type = 0 if list_overload else args["group_list_type"]
    weight = args["weight"]
    params = _GmmParams(len(weight) == 1 and weight[0].dim() == 3, **{
        name: args[name] for name in ("bias", "scale", "offset", "antiquant_scale", "antiquant_offset",
                                      "per_token_scale")})
    return _grouped_matmul(
        args["x"], weight, split_item=args["split_item"], group_type=group_type, act_type=args["act_type"],
        out_enum=out_enum, params=params,
        group_bounds_of=lambda rows: None if group_list is None else _gmm_group_bounds(group_list, list_type, rows))


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list: Optional[torch.Tensor] = None,
                       activation_input=None, activation_quant_scale=None, activation_quant_offset=None,
                       split_item: Optional[int] = 0, group_type: Optional[int] = None,
                       group_list_type: Optional[int] = 0, act_type: Optional[int] = 0, tuning_config=None,
                       output_dtype: Optional[int] = None, x_dtype: Optional[int] = None,
                       weight_dtype: Optional[int] = None, scale_dtype: Optional[int] = None,
                       per_token_scale_dtype: Optional[int] = None):
    """Grouped matmul ``y_g = act(x_g @ w_g + b_g)`` with optional (anti)quantisation.

    Groups are the x/weight pairs (several x), the row ranges of one x given by ``group_list``
    (group_type 0; type 0 cumulative ends, 1 sizes), or K ranges (group_type 2, output (G, M, N)).
    ``split_item`` 0: one output per x; 1: one per group; 2/3: one concatenated tensor.
    ``tuning_config`` is a performance hint and is ignored.
    """
    return _gmm_entry(dict(locals()), list_overload=False)


def npu_grouped_matmul_list(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                            antiquant_offset=None, per_token_scale=None, group_list: Optional[Sequence[int]] = None,
                            activation_input=None, activation_quant_scale=None, activation_quant_offset=None,
                            split_item: Optional[int] = 0, group_type: Optional[int] = None,
                            group_list_type: Optional[int] = 0, act_type: Optional[int] = 0,
                            output_dtype: Optional[torch.dtype] = None):
    """The ``.List`` overload: ``group_list`` is a list of cumulative ends, ``output_dtype`` a dtype."""
    return _gmm_entry(dict(locals()), list_overload=True)


# ----------------------------------------------------------------------------- MoE gating
def npu_moe_gating_top_k_softmax(x: torch.Tensor, finished: Optional[torch.Tensor] = None, k: int = 1):
    """Softmax over experts then top-k; returns (y, expert_idx int32, row_idx int32).

    ``row_idx[..., j] = j * num_rows + i`` for flattened row i.  A row whose ``finished`` flag is
    True reports expert index ``E`` (one past the last expert) so later routing drops it.
    """
    _check(x.dim() in (2, 3), "the x shape support only 2d and 3d)")
    experts = x.size(-1)
    _check(0 < k <= experts, lambda: f"npu_moe_gating_top_k_softmax: k must be in (0, {experts}], but got {k}")
    probs = torch.softmax(x.to(torch.float32), dim=-1)
    y, idx = _stable_topk(probs, k)
    if finished is not None:
        idx = torch.where(finished.to(torch.bool).unsqueeze(-1), torch.full_like(idx, experts), idx)
    num_rows = math.prod(x.shape[:-1])
    row_idx = (torch.arange(k) * num_rows + torch.arange(num_rows).unsqueeze(-1)).reshape(*x.shape[:-1], k)
    return y.to(x.dtype), idx.to(torch.int32), row_idx.to(torch.int32)


def npu_moe_gating_top_k(x: torch.Tensor, k: int, *, bias: Optional[torch.Tensor] = None,
                         input_ids: Optional[torch.Tensor] = None, tid2eid: Optional[torch.Tensor] = None,
                         k_group: int = 1, group_count: int = 1, group_select_mode: int = 0, renorm: int = 0,
                         norm_type: int = 0, out_flag: bool = False, routed_scaling_factor: float = 1.0,
                         eps: float = 1e-20):
    """Group-limited top-k routing (DeepSeek-V3 style), CANN aclnnMoeGatingTopK steps 1-6.

    norm = softmax/sigmoid(x); groups are scored on ``norm + bias`` (max, or top-2 sum); experts
    are picked from the best ``k_group`` groups on ``norm + bias``; the weights are gathered from
    ``norm`` (bias only steers selection) and renormalised: ``w / (sum(w) + eps) * factor``.
    Hash mode (``input_ids`` + ``tid2eid``) takes the experts from the table instead.
    """
    _check(x.dim() == 2, "the x shape support only 2d)")
    if bias is not None:
        _check(bias.dim() == 1, "the bias shape support only 1d)")
    _check((input_ids is None) == (tid2eid is None), "input_ids and tid2eid must be both provided or both omitted)")
    if input_ids is not None:
        _check(input_ids.dim() == 1, "the input_ids shape support only 1d)")
        _check(input_ids.size(0) == x.size(0), "The input_ids first dim should be same as x first dim)")
        _check(tid2eid.dim() == 2, "the tid2eid shape support only 2d)")
        _check(tid2eid.size(1) == k, "The tid2eid second dim should be same as k)")
    tokens, experts = x.shape
    _check(renorm == 0, lambda: f"npu_moe_gating_top_k: only renorm=0 is supported, but got {renorm}")
    _check(norm_type in (0, 1), lambda: f"npu_moe_gating_top_k: norm_type must be 0 (softmax) or 1 (sigmoid), "
                                        f"but got {norm_type}")
    _check(group_count > 0 and experts % group_count == 0,
           lambda: f"npu_moe_gating_top_k: the expert count {experts} must be divisible by group_count {group_count}")
    _check(1 <= k_group <= group_count,
           lambda: f"npu_moe_gating_top_k: k_group must be in [1, group_count={group_count}], but got {k_group}")
    per_group = experts // group_count
    _check(1 <= k <= per_group * k_group,
           lambda: f"npu_moe_gating_top_k: k must be in [1, {per_group * k_group}], but got {k}")
    _check(group_select_mode in (0, 1), lambda: f"npu_moe_gating_top_k: group_select_mode must be 0 or 1, "
                                                f"but got {group_select_mode}")
    logits = x.to(torch.float32)
    norm = torch.softmax(logits, dim=-1) if norm_type == 0 else torch.sigmoid(logits)
    if input_ids is not None:
        idx = tid2eid.to(torch.int64)[input_ids.to(torch.int64)]
    else:
        score = norm if bias is None else norm + bias.to(torch.float32)
        grouped = score.reshape(tokens, group_count, per_group)
        if group_select_mode == 0:
            group_score = grouped.amax(dim=-1)
        else:
            group_score = _stable_topk(grouped, min(2, per_group))[0].sum(dim=-1)
        _, best_groups = _stable_topk(group_score, k_group)
        keep = torch.zeros(tokens, group_count, dtype=torch.bool).scatter_(1, best_groups, True)
        masked = score.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        _, idx = _stable_topk(masked, k)
    weights = norm.gather(1, idx)
    y = weights / (weights.sum(dim=-1, keepdim=True) + eps) * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), norm


# ----------------------------------------------------------------------------- MoE routing
def _sort_by_expert(expert_idx: torch.Tensor):
    """Stable sort of the flattened (row-major) expert ids: (sorted experts, source positions)."""
    flat = expert_idx.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    return flat[order], order


def npu_moe_init_routing(x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int):
    """Sort the (token, k) pairs by expert and gather token rows into expert order.

    ``expanded_expert_idx, sorted_row_idx = stable key-value sort(expert_idx, row_idx)``;
    ``expanded_row_idx[sorted_row_idx[i]] = i``; ``expanded_x[i] = x[sorted_row_idx[i] % N]`` for the
    first ``min(N, active_num) * K`` rows.
    """
    n, k = x.size(0), expert_idx.size(1)
    sorted_experts, order = _sort_by_expert(expert_idx)
    sorted_rows = row_idx.reshape(-1).to(torch.int64)[order]
    expanded_row_idx = torch.zeros(n * k, dtype=torch.int64)
    expanded_row_idx[sorted_rows] = torch.arange(n * k)
    expanded_x = x[sorted_rows[:min(n, active_num) * k] % n]
    return expanded_x, expanded_row_idx.to(torch.int32), sorted_experts.to(torch.int32)


def _token_counts_output(counts: torch.Tensor, start: int, expert_num: int, kind: int, flag: bool) -> torch.Tensor:
    """expert_token_cumsum_or_count: 0 cumsum, 1 count over the active range, 2 (expert, count) pairs."""
    if not flag:
        return torch.zeros(0, dtype=torch.int64)
    if kind == 0:
        return counts.cumsum(0)
    if kind == 1:
        return counts
    pairs = torch.zeros(expert_num, 2, dtype=torch.int64)
    present = torch.nonzero(counts).flatten()
    pairs[:present.numel(), 0] = present + start
    pairs[:present.numel(), 1] = counts[present]
    return pairs


def npu_moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, *, scale: Optional[torch.Tensor] = None,
                            offset: Optional[torch.Tensor] = None, active_num: int = -1, expert_capacity: int = -1,
                            expert_num: int = -1, drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range: Sequence[int] = (), row_idx_type: int = 0,
                            x_dtype: Optional[int] = None):
    """MoE routing with an active expert range, optional dynamic int8 quant and token counts.

    Pairs whose expert lies in ``[start, end)`` are stably sorted by expert and gathered into
    ``expanded_x`` (dropless: the first ``min(active_num, N*K)`` of them, active_num <= 0 meaning
    all; drop-pad: ``expert_capacity`` slots per expert).  ``expanded_row_idx`` with row_idx_type
    0 is indexed by source pair ``n*K + k`` and holds its destination row or -1; with type 1 its
    first entries are the source pairs of the valid rows in order (-1 after them).
    """
    _check(x.dim() == 2, "the x shape support only 2d")
    _check(expert_idx.dim() == 2, "the expert_idx shape support only 2d")
    _check(x.size(0) == expert_idx.size(0), "the first dim of expert_idx and x should be the same")
    if active_expert_range:
        _check(len(active_expert_range) == 2, "active_expert_range is None or invalid. must be int[2]")
        _check(active_expert_range[1] > active_expert_range[0], "active_expert_range is invalid. must be increasing")
        _check(active_expert_range[0] >= 0 and active_expert_range[1] <= 10240,
               "active_expert_range must be within [0, 10240]")
        start, end = int(active_expert_range[0]), int(active_expert_range[1])
    else:
        _check(expert_num > 0, lambda: f"npu_moe_init_routing_v2: expert_num must be greater than 0 when "
                                       f"active_expert_range is empty, but got {expert_num}")
        start, end = 0, expert_num
    _check(drop_pad_mode in (0, 1), "drop_pad_mode is None or invalid. must be in [0, 1]")
    _check(expert_tokens_num_type in (0, 1, 2), "expert_tokens_num_type is None or invalid. must be in [0, 1, 2]")
    _check(row_idx_type in (0, 1), "row_idx_type is None or invalid. must be in [0, 1]")
    if quant_mode not in (-1, 1) or x_dtype is not None:
        raise _unsupported("npu_moe_init_routing_v2", f"quant_mode={quant_mode}, x_dtype={x_dtype}")
    n, h = x.shape
    k = expert_idx.size(1)
    sorted_experts, order = _sort_by_expert(expert_idx)
    in_range = (sorted_experts >= start) & (sorted_experts < end)
    experts, sources = sorted_experts[in_range], order[in_range]
    if drop_pad_mode == 1:
        offered = torch.bincount(experts - start, minlength=end - start)
        rank = torch.arange(experts.numel()) - (offered.cumsum(0) - offered)[experts - start]
        kept = rank < expert_capacity
        experts, sources = experts[kept], sources[kept]
        dest = (experts - start) * expert_capacity + rank[kept]
        out_rows = (expert_num, expert_capacity)
    else:
        limit = n * k if active_num <= 0 else min(active_num, n * k)
        experts, sources = experts[:limit], sources[:limit]
        dest = torch.arange(sources.numel())
        out_rows = (limit,)
    counts = torch.bincount(experts - start, minlength=end - start)
    rows = x.to(torch.float32)[sources // k]
    if quant_mode == 1:
        if scale is not None:
            rows = rows * (scale.to(torch.float32)[experts - start] if scale.size(0) > 1 else scale.to(torch.float32))
        rows, row_scale = _pertoken_int8(rows)
    else:
        row_scale = scale.to(torch.float32)[sources // k] if scale is not None else torch.zeros(sources.numel())
    flat_rows = math.prod(out_rows)
    expanded_x = torch.zeros(flat_rows, h, dtype=rows.dtype if quant_mode == 1 else x.dtype)
    expanded_x[dest] = rows.to(expanded_x.dtype)
    expanded_scale = torch.zeros(flat_rows, dtype=torch.float32)
    expanded_scale[dest] = row_scale
    expanded_row_idx = torch.full((n * k,), -1, dtype=torch.int64)
    if row_idx_type == 0:
        expanded_row_idx[sources] = dest
    else:
        expanded_row_idx[:sources.numel()] = sources
    return (expanded_x.reshape(*out_rows, h), expanded_row_idx.to(torch.int32),
            _token_counts_output(counts, start, expert_num, expert_tokens_num_type, expert_tokens_num_flag),
            expanded_scale)


def npu_moe_finalize_routing(expanded_permuted_rows: torch.Tensor, skip1: Optional[torch.Tensor],
                             skip2: Optional[torch.Tensor], bias: Optional[torch.Tensor], scales: Optional[torch.Tensor],
                             expanded_src_to_dst_row: torch.Tensor, export_for_source_row: Optional[torch.Tensor],
                             drop_pad_mode: Optional[int] = 0, k: Optional[int] = 1) -> torch.Tensor:
    """Un-permute expert outputs and combine them per token.

    ``out[i] = skip1[i] + skip2[i] + sum_k scales[i,k] * (rows[src_to_dst[pos(i,k)]] + bias[expert[i,k]])``
    with ``pos = i + k*N`` for drop_pad_mode 0/1 (column-major, npu_moe_init_routing) and
    ``i*K + k`` for 2/3 (row-major, npu_moe_init_routing_v2); modes 1/3 read an (E, C, H)
    input, and a destination of -1 (a dropped pair) contributes nothing.
    """
    mode = drop_pad_mode or 0
    _check(mode in (0, 1, 2, 3), lambda: f"npu_moe_finalize_routing: drop_pad_mode must be in [0, 3], but got {mode}")
    rows = expanded_permuted_rows.to(torch.float32)
    rows = rows.reshape(-1, rows.size(-1))
    n = scales.size(0) if scales is not None else expanded_src_to_dst_row.numel() // k
    top = scales.size(1) if scales is not None else k
    token, choice = torch.arange(n).unsqueeze(1), torch.arange(top).unsqueeze(0)
    positions = token + choice * n if mode in (0, 1) else token * top + choice
    dest = expanded_src_to_dst_row.to(torch.int64)[positions]
    valid = dest >= 0
    gathered = rows[dest.clamp(min=0)]
    if bias is not None:
        gathered = gathered + bias.to(torch.float32)[export_for_source_row.to(torch.int64)]
    weight = scales.to(torch.float32) if scales is not None else torch.ones(n, top)
    out = (gathered * (weight * valid).unsqueeze(-1)).sum(dim=1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.to(torch.float32)
    return out.to(expanded_permuted_rows.dtype)


# ----------------------------------------------------------------------------- MC2 dispatch / combine
def _single_rank_only(op: str, ep_world_size: int, tp_world_size: int, shared_expert_rank_num: int):
    if ep_world_size != 1 or tp_world_size > 1 or shared_expert_rank_num != 0:
        raise _unsupported(op, f"ep_world_size={ep_world_size}, tp_world_size={tp_world_size}, "
                               f"shared_expert_rank_num={shared_expert_rank_num} (this is the single-rank reference; "
                               f"across ranks, call it on NPU tensors inside npugraph.run_ranks)")


def _dispatch_plan(expert_ids: torch.Tensor, active: torch.Tensor, moe_expert_num: int):
    """Where each (token, k) pair of this rank goes: (expert, slot among this rank's rows to that expert).

    Slots count earlier active tokens of the same rank routed to the same expert, which is what
    ``expand_idx`` reports and ``combine`` uses to find the row again.
    """
    experts = expert_ids.to(torch.int64)
    flat = experts.reshape(-1)
    sent = active.unsqueeze(1).expand_as(experts).reshape(-1)
    one_hot = F.one_hot(flat, moe_expert_num) * sent.unsqueeze(1)
    slots = (one_hot.cumsum(0) - one_hot).gather(1, flat.unsqueeze(1)).squeeze(1)
    return flat, slots, sent


def npu_moe_distribute_dispatch(x: torch.Tensor, expert_ids: torch.Tensor, group_ep: str, ep_world_size: int,
                                ep_rank_id: int, moe_expert_num: int, *, scales: Optional[torch.Tensor] = None,
                                x_active_mask: Optional[torch.Tensor] = None,
                                expert_scales: Optional[torch.Tensor] = None, group_tp: str = "",
                                tp_world_size: int = 0, tp_rank_id: int = 0, expert_shard_type: int = 0,
                                shared_expert_num: int = 1, shared_expert_rank_num: int = 0, quant_mode: int = 0,
                                global_bs: int = 0, expert_token_nums_type: int = 1):
    """MC2 expert-parallel dispatch, single-rank reference (ep_world_size 1, no shared-expert ranks).

    Outputs: (expand_x (A, H), dynamic_scales (A,) f32, expand_idx (N*K,) i32, expert_token_nums
    (local experts,) i64 [count, or cumsum for type 0], ep_recv_counts (W*local,) i32 [prefix sums in
    (local expert, source rank) order], tp_recv_counts (tp_world_size,) i32, expand_scales (A,) f32
    or (0,)).  expand_x holds the received rows grouped by local expert, then source rank, then
    token order; rows past the received ones are zero.  Quantisation (quant_mode 2, or smooth
    ``scales`` given) is dynamic per-row int8 of ``x * scales[expert]``.

    Multi-rank (runtime/collectives.py ``_dispatch``, reached for NPU tensors inside
    npugraph.run_ranks): each rank computes ``_dispatch_plan`` locally (destination rank =
    expert // local experts); the rows (and expert_scales) go to their destinations, every
    receiver lays them out by (local expert, source rank) and publishes the prefix sums as
    ep_recv_counts.  ``expand_idx`` stays a sender-local slot, so combine
    can find row ``ep_send_counts[e*W + r - 1] + slot`` on the owner of expert e and send it back.
    """
    op = "npu_moe_distribute_dispatch"
    _single_rank_only(op, ep_world_size, tp_world_size, shared_expert_rank_num)
    if quant_mode not in (0, 2):
        raise _unsupported(op, f"quant_mode={quant_mode}")
    n, h = x.shape
    k = expert_ids.size(1)
    local = moe_expert_num // ep_world_size
    rows_out = (global_bs or n * ep_world_size) * min(local, k)
    active = x_active_mask.to(torch.bool) if x_active_mask is not None else torch.ones(n, dtype=torch.bool)
    experts, slots, sent = _dispatch_plan(expert_ids, active, moe_expert_num)
    counts = torch.bincount(experts[sent], minlength=moe_expert_num)
    dest = (counts.cumsum(0) - counts)[experts] + slots
    dest, src = dest[sent], torch.arange(n * k)[sent]
    rows = x.to(torch.float32)[src // k]
    quantise = quant_mode == 2 or scales is not None
    dynamic_scales = torch.zeros(rows_out, dtype=torch.float32)
    if quantise:
        if scales is not None:
            rows = rows * scales.to(torch.float32)[experts[sent]]
        rows, dynamic_scales[dest] = _pertoken_int8(rows)
    expand_x = torch.zeros(rows_out, h, dtype=torch.int8 if quantise else x.dtype)
    expand_x[dest] = rows.to(expand_x.dtype)
    expand_scales = torch.zeros(rows_out if expert_scales is not None else 0, dtype=torch.float32)
    if expert_scales is not None:
        expand_scales[dest] = expert_scales.to(torch.float32).reshape(-1)[src]
    token_nums = counts.cumsum(0) if expert_token_nums_type == 0 else counts
    return (expand_x, dynamic_scales, slots.to(torch.int32), token_nums.to(torch.int64),
            counts.cumsum(0).to(torch.int32), torch.zeros(tp_world_size, dtype=torch.int32), expand_scales)


def npu_moe_distribute_combine(expand_x: torch.Tensor, expert_ids: torch.Tensor, expand_idx: torch.Tensor,
                               ep_send_counts: torch.Tensor, expert_scales: torch.Tensor, group_ep: str,
                               ep_world_size: int, ep_rank_id: int, moe_expert_num: int, *,
                               tp_send_counts: Optional[torch.Tensor] = None,
                               x_active_mask: Optional[torch.Tensor] = None,
                               activation_scale: Optional[torch.Tensor] = None,
                               weight_scale: Optional[torch.Tensor] = None, group_list: Optional[torch.Tensor] = None,
                               expand_scales: Optional[torch.Tensor] = None,
                               shared_expert_x: Optional[torch.Tensor] = None, group_tp: str = "",
                               tp_world_size: int = 0, tp_rank_id: int = 0, expert_shard_type: int = 0,
                               shared_expert_num: int = 1, shared_expert_rank_num: int = 0, global_bs: int = 0,
                               out_dtype: int = 0, comm_quant_mode: int = 0, group_list_type: int = 0) -> torch.Tensor:
    """MC2 inverse of dispatch, single-rank reference: ``out[n] = sum_k expert_scales[n,k] * row(n,k)``.

    ``row(n,k) = expand_x[ep_send_counts[e*W + r - 1] + expand_idx[n*K+k]]`` for e = expert_ids[n,k]
    (0 for the first segment), plus ``shared_expert_x[n]``; masked-out tokens give zero rows.
    Multi-rank (runtime/collectives.py ``_combine``): the owner of each segment sends it back
    to rank r (the reverse all-to-all of dispatch); the weighted sum then runs on rank r as here.
    """
    op = "npu_moe_distribute_combine"
    _single_rank_only(op, ep_world_size, tp_world_size, shared_expert_rank_num)
    if activation_scale is not None or weight_scale is not None or comm_quant_mode:
        raise _unsupported(op, "quantised combine (activation_scale / weight_scale / comm_quant_mode)")
    n, k = expert_ids.shape
    experts = expert_ids.to(torch.int64).reshape(-1)
    segment = experts * ep_world_size + ep_rank_id
    starts = torch.cat((torch.zeros(1, dtype=torch.int64), ep_send_counts.to(torch.int64)))[segment]
    rows = expand_x.to(torch.float32)[starts + expand_idx.to(torch.int64)].reshape(n, k, -1)
    out = (rows * expert_scales.to(torch.float32).unsqueeze(-1)).sum(dim=1)
    if shared_expert_x is not None:
        out = out + shared_expert_x.to(torch.float32)
    if x_active_mask is not None:
        out = out * x_active_mask.to(torch.float32).unsqueeze(-1)
    return out.to(expand_x.dtype)


# ----------------------------------------------------------------------------- attention
# input_layout -> (query/key layout, attention_out layout, query rank); facts of torch_npu's meta kernel.
_FIA_LAYOUTS = {
    "BSH": ("BSH", "BSH", 3), "BSND": ("BSND", "BSND", 4), "BNSD": ("BNSD", "BNSD", 4),
    "TND": ("TND", "TND", 3), "NTD": ("NTD", "NTD", 3), "BNSD_BSND": ("BNSD", "BSND", 4),
    "BSH_BNSD": ("BSH", "BNSD", 3), "BSND_BNSD": ("BSND", "BNSD", 4), "NTD_TND": ("NTD", "TND", 3),
    "BSH_NBSD": ("BSH", "NBSD", 3), "BSND_NBSD": ("BSND", "NBSD", 4), "BNSD_NBSD": ("BNSD", "NBSD", 4),
    "TND_NTD": ("TND", "NTD", 3), "NSD": ("NSD", "NSD", 3),
}
_FIA = "npu_fused_infer_attention_score"
_COMPRESSED_MASK = 2048


def _bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    """A batch-major tensor in ``layout`` as (B, N, S, D)."""
    if layout == "BSH":
        return t.reshape(t.size(0), t.size(1), heads, t.size(2) // heads).transpose(1, 2)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t.unsqueeze(0) if layout == "NSD" else t


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2)
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "NBSD":
        return t.transpose(0, 1)
    return t[0] if layout == "NSD" else t


def _lengths(values, batch: int, full: int, what: str):
    """Per-batch valid lengths: None -> full, one value -> broadcast, else the first ``batch``."""
    if values is None:
        return [full] * batch
    values = [int(v) for v in values]
    if len(values) == 1:
        return values * batch
    _check(len(values) >= batch, lambda: f"{_FIA}: {what} has {len(values)} entries for batch {batch}")
    return values[:batch]


def _segments(t: torch.Tensor, layout: str, cumulative, what: str):
    """A token-major (TND/NTD) tensor split into per-batch (N, S_b, D) pieces by cumulative lengths."""
    _check(cumulative is not None, lambda: f"{_FIA}: {what} must be given for layout {layout}")
    tnd = t if layout == "TND" else t.transpose(0, 1)
    ends = [int(v) for v in cumulative]
    return [tnd[lo:hi].transpose(0, 1) for lo, hi in zip([0] + ends[:-1], ends)]


def _paged(cache: torch.Tensor, block_table: torch.Tensor, lengths, kv_heads: int):
    """Gather each batch's KV from a paged cache (blocks, block_size, H) or (blocks, N, block_size, D)."""
    pieces = []
    for b, length in enumerate(lengths):
        block_size = cache.size(1) if cache.dim() == 3 else cache.size(2)
        blocks = block_table[b, :(length + block_size - 1) // block_size].to(torch.int64)
        if cache.dim() == 3:
            seq = cache[blocks].reshape(-1, kv_heads, cache.size(2) // kv_heads).transpose(0, 1)
        else:
            seq = cache[blocks].transpose(0, 1).flatten(1, 2)
        pieces.append(seq[:, :length])
    return pieces


def _user_mask(atten_mask: torch.Tensor, b: int, s_q: int, s_kv: int, batch: int) -> torch.Tensor:
    """Batch b's slice of a full atten_mask as bool (1 or N, s_q, s_kv); True = masked out."""
    m = atten_mask.to(torch.bool)
    if m.dim() == 2:
        m = m[b].reshape(1, 1, -1) if (s_q == 1 and m.size(0) == batch) else m.unsqueeze(0)
    elif m.dim() == 3:
        m = m[b if m.size(0) > 1 else 0].unsqueeze(0)
    else:
        m = m[b if m.size(0) > 1 else 0]
    return m[..., :s_q, :s_kv]


def _band(s_q: int, s_kv: int, shift: int, pre: int, nxt: int) -> torch.Tensor:
    """True where key j is outside ``[i + shift - pre, i + shift + nxt]`` for query row i."""
    rel = torch.arange(s_kv).unsqueeze(0) - torch.arange(s_q).unsqueeze(1) - shift
    return (rel > nxt) | (rel < -pre)


def _attention_mask(sparse_mode, atten_mask, b, s_q, s_kv, batch, pre_tokens, next_tokens, incremental):
    """The boolean mask of one batch for sparse modes 0-4 (None = nothing masked)."""
    if incremental or sparse_mode in (0, 1):
        if atten_mask is None:
            return None
        mask = _user_mask(atten_mask, b, s_q, s_kv, batch)
        if sparse_mode == 0 and not incremental:
            mask = mask | _band(s_q, s_kv, 0, pre_tokens, next_tokens)
        return mask
    _check(atten_mask is not None and tuple(atten_mask.shape[-2:]) == (_COMPRESSED_MASK, _COMPRESSED_MASK),
           lambda: f"{_FIA}: sparse_mode {sparse_mode} needs the compressed causal atten_mask of shape "
                   f"(2048, 2048), (1, 2048, 2048) or (1, 1, 2048, 2048)")
    if sparse_mode == 2:
        return _band(s_q, s_kv, 0, s_kv, 0)
    if sparse_mode == 3:
        return _band(s_q, s_kv, s_kv - s_q, s_kv + s_q, 0)
    return _band(s_q, s_kv, s_kv - s_q, pre_tokens, next_tokens)


def _attend(q, k, v, scale, mask, pse):
    """Softmax attention of one batch: q (N, Sq, D), k/v (N, Skv, D) already head-matched."""
    scores = scale * (q @ k.transpose(-1, -2))
    if pse is not None:
        scores = scores + pse
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    dead = torch.isneginf(lse)
    probs = torch.exp(scores - torch.where(dead, torch.zeros_like(lse), lse).unsqueeze(-1))
    out = torch.where(dead.unsqueeze(-1), 0.0, probs @ v)
    return out, torch.where(dead, torch.full_like(lse, float("inf")), lse)


_FIA_UNMODELLED = ("dequant_scale1", "quant_scale1", "dequant_scale2", "antiquant_scale", "antiquant_offset",
                   "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset",
                   "query_padding_size", "kv_padding_size", "key_shared_prefix", "value_shared_prefix",
                   "actual_shared_prefix_len", "key_rope_antiquant_scale")


def npu_fused_infer_attention_score(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, pse_shift=None, atten_mask=None,
        actual_seq_lengths=None, actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None,
        dequant_scale2=None, quant_scale2=None, quant_offset2=None, antiquant_scale=None, antiquant_offset=None,
        key_antiquant_scale=None, key_antiquant_offset=None, value_antiquant_scale=None,
        value_antiquant_offset=None, block_table=None, query_padding_size=None, kv_padding_size=None,
        key_shared_prefix=None, value_shared_prefix=None, actual_shared_prefix_len=None, query_rope=None,
        key_rope=None, key_rope_antiquant_scale=None, num_heads: int = 1, scale: float = 1.0,
        pre_tokens: int = 2147483647, next_tokens: int = 2147483647, input_layout: str = "BSH",
        num_key_value_heads: int = 0, sparse_mode: int = 0, inner_precise: int = 0, block_size: int = 0,
        antiquant_mode: int = 0, key_antiquant_mode: int = 0, value_antiquant_mode: int = 0,
        softmax_lse_flag: bool = False):
    """Inference attention ``softmax(scale*QK^T + pse, masked) V`` for all torch_npu layouts.

    GQA: query head h reads KV head ``h // (num_heads / num_key_value_heads)``.  atten_mask is
    bool/int8/uint8 with nonzero = masked.  sparse_mode 0 (full mask or none, plus the pre/next
    token band when a mask is given), 1 (full mask), 2 (left-up causal), 3 (right-down causal),
    4 (right-down band); with a one-token query (no rope) sparse_mode and the band are ignored.
    actual_seq_lengths(_kv) are per-batch lengths, cumulative for TND/NTD; rows past them are 0.
    MLA rope parts are concatenated to Q/K; a block_table reads KV from a paged cache.  Rows with
    every key masked give output 0 and softmax_lse +inf; without softmax_lse_flag the lse is the
    meta kernel's empty [0] tensor.  quant_scale2/quant_offset2 requantise the output to int8.
    """
    _check(num_heads > 0, lambda: "numHeads should be greater than 0, but got " + str(num_heads))
    _check(input_layout in _FIA_LAYOUTS, lambda: f"Layout {input_layout} is not supported!")
    q_layout, out_layout, q_rank = _FIA_LAYOUTS[input_layout]
    _check(query.dim() == q_rank, lambda: f"Layout {q_layout}, queryDims({query.dim()}) must be {q_rank}!")
    args = locals()
    given = [name for name in _FIA_UNMODELLED if args[name] is not None]
    if given:
        raise _unsupported(_FIA, ", ".join(given))
    if query.dtype == torch.int8 or key.dtype in (torch.int8, torch.int32):
        raise _unsupported(_FIA, "int8/int4 query, key or value")
    _check(sparse_mode in (0, 1, 2, 3, 4),
           lambda: f"{_FIA}: sparse_mode {sparse_mode} is not supported, expected 0, 1, 2, 3 or 4")
    _check((query_rope is None) == (key_rope is None), f"{_FIA}: query_rope and key_rope must be given together")
    kv_heads = num_key_value_heads or num_heads
    token_major = q_layout in ("TND", "NTD")

    def per_batch_q(t):
        if token_major:
            return _segments(t, q_layout, actual_seq_lengths, "actual_seq_lengths")
        return list(_bnsd(t, q_layout, num_heads))

    def per_batch_kv(t):
        if block_table is not None:
            _check(actual_seq_lengths_kv is not None, f"{_FIA}: a block_table needs actual_seq_lengths_kv")
            return _paged(t, block_table, _lengths(actual_seq_lengths_kv, len(qs), 0, "actual_seq_lengths_kv"),
                          kv_heads)
        if token_major:
            return _segments(t, q_layout, actual_seq_lengths_kv, "actual_seq_lengths_kv")
        t4 = _bnsd(t, q_layout, kv_heads)
        lengths = _lengths(actual_seq_lengths_kv, len(qs), t4.size(2), "actual_seq_lengths_kv")
        return [t4[b, :, :n] for b, n in enumerate(lengths)]

    qs = _with_rope(per_batch_q(query), None if query_rope is None else per_batch_q(query_rope))
    ks = _with_rope(per_batch_kv(key), None if key_rope is None else per_batch_kv(key_rope))
    vs = _with_rope(per_batch_kv(value), None)
    full_q = [q.size(1) for q in qs]
    incremental = max(full_q) == 1 and query_rope is None
    q_lens = full_q if token_major or incremental else _lengths(actual_seq_lengths, len(qs), full_q[0],
                                                                 "actual_seq_lengths")
    heads = qs[0].size(0)
    _check(heads % ks[0].size(0) == 0, lambda: f"{_FIA}: num_heads {heads} must be a multiple of "
                                               f"num_key_value_heads {ks[0].size(0)}")
    group = heads // ks[0].size(0)
    outs, lses = [], []
    for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
        s_q, s_kv = q_lens[b], k.size(1)
        mask = _attention_mask(sparse_mode, atten_mask, b, s_q, s_kv, len(qs), pre_tokens, next_tokens, incremental)
        pse = None if pse_shift is None else _f32(pse_shift[b if pse_shift.size(0) > 1 else 0])[:, :s_q, :s_kv]
        out, lse = _attend(q[:, :s_q], k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0),
                           scale, mask, pse)
        out = out.to(query.dtype) if quant_scale2 is None else _requantise(out, quant_scale2, quant_offset2)
        outs.append(F.pad(out, (0, 0, 0, full_q[b] - s_q)))
        lses.append(F.pad(lse, (0, full_q[b] - s_q)))
    if token_major:
        pad = query.size(0 if q_layout == "TND" else 1) - sum(full_q)
        out_t = F.pad(torch.cat(outs, dim=1), (0, 0, 0, pad))
        attention = out_t.transpose(0, 1) if out_layout == "TND" else out_t
        lse_out = F.pad(torch.cat(lses, dim=1), (0, pad)).transpose(0, 1).unsqueeze(-1)
    else:
        attention = _from_bnsd(torch.stack(outs), out_layout)
        lse_out = torch.stack(lses).unsqueeze(-1)
    if not softmax_lse_flag:
        lse_out = torch.empty(0, dtype=torch.float32)
    return attention, lse_out


def _with_rope(main, rope):
    """Per-batch float32 pieces, with the MLA rope pieces appended on the last dim when given."""
    if rope is None:
        return [_f32(m) for m in main]
    return [torch.cat((_f32(m), _f32(r)), dim=-1) for m, r in zip(main, rope)]


def _requantise(out: torch.Tensor, quant_scale2: torch.Tensor, quant_offset2: Optional[torch.Tensor]):
    """int8 output quantisation of one batch (N, S, D): per-tensor, or per-channel over N*D (= H)."""
    def shaped(t):
        t = t.to(torch.float32)
        return t.reshape(()) if t.numel() == 1 else t.reshape(out.size(0), 1, -1)
    y = out * shaped(quant_scale2)
    if quant_offset2 is not None:
        y = y + shaped(quant_offset2)
    return _quant_round(y, 127.0)


# ----------------------------------------------------------------------------- side-effect / format ops
def npu_prefetch(self: torch.Tensor, dependency: Optional[torch.Tensor], max_size: int, offset: int = 0) -> None:
    """L2 prefetch hint: no numeric effect; only the argument checks of the meta kernel."""
    _check(max_size > 0, lambda: f"The max_size should be greater than zero, but got {max_size}.")
    _check(offset >= 0, lambda: f"The offset should be nonnegative, but got {offset}.")


def npu_format_cast(self: torch.Tensor, acl_format: int, *, customize_dtype: Optional[int] = None,
                    input_dtype: Optional[int] = None) -> torch.Tensor:
    """Storage-format change: values are unchanged (the runtime tracks the format tag)."""
    return self.clone()


def npu_format_cast_tensor(self: torch.Tensor, dst: torch.Tensor, *, customize_dtype: Optional[int] = None,
                           input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast.Tensor``: take ``dst``'s format; values unchanged."""
    return self.clone()


def npu_format_cast_inplace(self: torch.Tensor, src: torch.Tensor, *, customize_dtype: Optional[int] = None,
                            input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast_``: in-place format change, returns ``self`` with values unchanged."""
    return self


def npu_format_cast_inplace_acl_format(self: torch.Tensor, acl_format: int, *, customize_dtype: Optional[int] = None,
                                       input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast_.acl_format``: in-place format change by format number."""
    return self
