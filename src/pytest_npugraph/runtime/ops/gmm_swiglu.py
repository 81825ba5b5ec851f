"""Quantised grouped matmuls of the MoE expert MLP: npu_grouped_matmul_swiglu_quant (and _v2), fusing the
W8A8 gate/up projection, its dequantisation, SwiGLU and the per-token requantisation of the result, and
npu_quant_grouped_matmul_dequant (310P: quantise x, grouped int8 matmul, dequantise).

Who calls them: vLLM-Ascend's W8A8-dynamic fused MoE (``moe_mlp.py``: gmm1 + swiglu + quant in one kernel,
whose int8 output and scale feed gmm2), and its 310P MoE MLP (``npu_quant_grouped_matmul_dequant`` for both
projections).

* swiglu_quant: rows ``[start_e, end_e)`` of x (int8 [M, K]; ``group_list`` cumulative ends, or counts with
  ``group_list_type=1`` in v2) multiply expert e's int8 weight [K, N]; ``h = (x @ W_e) * x_scale[:, None] *
  weight_scale[e]`` (float32), ``a = silu(h[:, :N/2]) * h[:, N/2:]`` (npu_swiglu's halves), then per row
  ``scale = max|a| / 127`` and ``out = round(a / scale)`` (int8).  Rows past ``group_list[-1]`` are not
  computed (the kernel leaves them undefined; zeros here).  v1 returns ``(out [M, N/2], scale [M], offset
  [])``, v2 ``(out, scale)``; v2's ``quant_dtype`` may also be float8 (e4m3fn/e5m2: scale = max|a| / 448 or
  57344), its ``dequant_dtype`` float16/bfloat16 rounds ``h`` to that dtype first.  Int4 (int32-packed)
  weights, MX modes (``dequant_mode=2``), bias and offsets are not emulated.
* quant_grouped_matmul_dequant: x float16 [M, K] is quantised per token (``pertoken``: ``s = max|x| / 127``;
  ``pertensor``: ``x_scale``, one value; ``smooth_scale`` [K] multiplies x first), weight int8 [E, N, K] with
  weight_scale [E, N]; ``y = (x_q @ W_e^T) * s * weight_scale[e]`` in float16 [M, N].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import _check, _dtype_of, _dtype_str, _pertoken_int8, _unsupported
from .gmm import _gmm_group_bounds
from .spec import OpSpec, generated, mix

_V1 = "npu_grouped_matmul_swiglu_quant"
_V2 = "npu_grouped_matmul_swiglu_quant_v2"
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _expert_rows(op, x, weight, weight_scale, x_scale, group_list, group_list_type, dequant_dtype=torch.float32):
    """SwiGLU of the dequantised grouped matmul, float32 [M, N/2] (zeros past the last group)."""
    _check(x.dim() == 2 and x.dtype == torch.int8, lambda: f"{op}: x must be a 2-D int8 tensor, but got "
                                                           f"{x.dtype} {list(x.shape)}")
    if weight.dtype != torch.int8 or weight.dim() != 3:
        raise _unsupported(op, f"weight of dtype {weight.dtype} and rank {weight.dim()} (only int8 [E, K, N])")
    experts, k, n = weight.shape
    _check(x.size(1) == k, lambda: f"{op}: x's K ({x.size(1)}) must match weight's K ({k})")
    _check(group_list.numel() == experts,
           lambda: f"{op}: group_list must hold one entry per expert ({experts}), but got {group_list.numel()}")
    _check(weight_scale.shape[0] == experts and weight_scale.shape[-1] == n,
           lambda: f"{op}: weight_scale must be [E={experts}, N={n}], but got {list(weight_scale.shape)}")
    _check(x_scale.numel() == x.size(0), lambda: f"{op}: x_scale must hold one value per row of x ({x.size(0)})")
    _check(n % 2 == 0, lambda: f"{op}: N ({n}) must be even (SwiGLU halves)")
    rows = x.size(0)
    out = torch.zeros(rows, n // 2, dtype=torch.float32)
    valid = torch.zeros(rows, dtype=torch.bool)
    xs = x_scale.reshape(-1).float()
    for e, (start, end) in enumerate(_gmm_group_bounds(group_list.tolist(), group_list_type, rows)):
        if end <= start:
            continue
        acc = x[start:end].double() @ weight[e].double()                    # exact int32 accumulation
        h = (acc.float() * xs[start:end, None] * weight_scale[e].reshape(-1).float())
        if dequant_dtype in (torch.float16, torch.bfloat16):
            h = h.to(dequant_dtype).float()
        out[start:end] = F.silu(h[:, :n // 2]) * h[:, n // 2:]
        valid[start:end] = True
    return out, valid


def npu_grouped_matmul_swiglu_quant(x, weight, group_list, weight_scale, x_scale, *, bias=None, offset=None):
    if bias is not None or offset is not None:
        raise _unsupported(_V1, "bias / offset (reserved inputs)")
    a, valid = _expert_rows(_V1, x, weight, weight_scale, x_scale, group_list, 0)
    q, scale = _pertoken_int8(a)
    return q * valid[:, None], scale * valid, torch.zeros((), dtype=torch.float32)


def _v1_meta(x, weight, group_list, weight_scale, x_scale, *, bias=None, offset=None):
    n = weight_scale.size(-1)
    return (x.new_empty([x.size(0), n // 2], dtype=torch.int8), x.new_empty([x.size(0)], dtype=torch.float32),
            x.new_empty([], dtype=torch.float32))


def _v2_checks(weight, weight_scale, quant_dtype, dequant_dtype):
    _check(len(weight) == 1, lambda: f"The size of weight should be 1, current size is {len(weight)}.")
    _check(len(weight_scale) == 1, lambda: f"The size of weight_scale should be 1, current size is {len(weight_scale)}.")
    _check(_dtype_of(quant_dtype) in (torch.int8, torch.float8_e5m2, torch.float8_e4m3fn) or
           quant_dtype in (290, 296, 297),
           lambda: "quant_dtype only supports torch.int8, torch.float8_e5m2, torch.float8_e4m3fn, "
                   "torch_npu.float4_e2m1fn_x2, torch_npu.float4_e1m2fn_x2, torch_npu.hifloat8 for now, but it is "
                   f"{_dtype_str(quant_dtype)}")
    _check(_dtype_of(dequant_dtype) in (torch.int8, torch.float32, torch.bfloat16, torch.float16),
           lambda: "dequant_dtype only supports torch.int8, torch.float32, torch.bfloat16, torch.float16 for now, "
                   f"but it is {_dtype_str(dequant_dtype)}")


def npu_grouped_matmul_swiglu_quant_v2(x, weight, weight_scale, x_scale, group_list, *, smooth_scale=None,
                                       weight_assist_matrix=None, bias=None, dequant_mode=0, dequant_dtype=6,
                                       quant_mode=0, quant_dtype=1, group_list_type=0, tuning_config=None,
                                       x_dtype=None, weight_dtype=None, weight_scale_dtype=None, x_scale_dtype=None):
    _v2_checks(weight, weight_scale, quant_dtype, dequant_dtype)
    for name, value in (("smooth_scale", smooth_scale), ("weight_assist_matrix", weight_assist_matrix),
                        ("bias", bias), ("x_dtype", x_dtype), ("weight_dtype", weight_dtype),
                        ("weight_scale_dtype", weight_scale_dtype), ("x_scale_dtype", x_scale_dtype)):
        if value is not None:
            raise _unsupported(_V2, f"{name} (A8W4 / A4W4 / MX modes)")
    if dequant_mode not in (0, None) or quant_mode not in (0, None):
        raise _unsupported(_V2, f"dequant_mode {dequant_mode} / quant_mode {quant_mode} (only 0: per-token x "
                                "per-channel)")
    target = _dtype_of(quant_dtype)
    if target not in (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2):
        raise _unsupported(_V2, f"quant_dtype {_dtype_str(quant_dtype)}")
    a, valid = _expert_rows(_V2, x, weight[0], weight_scale[0], x_scale, group_list, group_list_type or 0,
                            _dtype_of(dequant_dtype))
    if target == torch.int8:
        q, scale = _pertoken_int8(a)
        return q * valid[:, None], scale * valid
    limit = _FP8_MAX[target]
    scale = a.abs().amax(dim=-1) / limit
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (a / safe[:, None]).clamp(-limit, limit) * valid[:, None]
    return q.to(target), scale * valid


def _v2_meta(x, weight, weight_scale, x_scale, group_list, *, quant_dtype=1, dequant_dtype=6, **_):
    _v2_checks(weight, weight_scale, quant_dtype, dequant_dtype)
    n = weight_scale[0].size(-1)
    _check(n // 2 > 0, lambda: f"output_n is half of n. it must be greater than 0, but currently it is {n // 2}.")
    target = _dtype_of(quant_dtype)
    dtype = target if target in _FP8_MAX else torch.int8
    return x.new_empty([x.size(0), n // 2], dtype=dtype), x.new_empty([x.size(0)], dtype=torch.float32)


# ------------------------------------------------------------------ npu_quant_grouped_matmul_dequant
_QGMMD = "npu_quant_grouped_matmul_dequant"


def _qgmmd_checks(x, quantized_weight, weight_scale) -> None:
    """The wheel's meta checks, messages verbatim."""
    _check(x.dim() == 2, "the x dim support only 2")
    _check(x.dtype == torch.float16, "the x dtype support only float16")
    _check(quantized_weight.dim() == 3, "the quantized_weight dim support only 3")
    _check(quantized_weight.dtype == torch.int8, "the quantized_weight dtype support only int8")
    _check(weight_scale.dim() == 2, "the weight_scale dim support only 2")
    _check(weight_scale.dtype == torch.float, "the weight_scale dtype support only float")
    _check(x.shape[1] == quantized_weight.shape[2], "x shape[1] not equal to quantized_weight shape[1]")
    _check(weight_scale.shape[0] == quantized_weight.shape[0], "weight_scale shape[0] not equal to quantized_weight shape[0]")
    _check(weight_scale.shape[1] == quantized_weight.shape[1], "weight_scale shape[1] not equal to quantized_weight shape[1]")


def npu_quant_grouped_matmul_dequant(x, quantized_weight, weight_scale, group_list, *, bias=None, x_scale=None,
                                     x_offset=None, smooth_scale=None, quant_mode="pertoken"):
    _qgmmd_checks(x, quantized_weight, weight_scale)
    if bias is not None or x_offset is not None:
        raise _unsupported(_QGMMD, "bias / x_offset")
    _check(quant_mode in ("pertoken", "pertensor"),
           lambda: f"{_QGMMD}: quant_mode only supports pertoken and pertensor, but got {quant_mode}")
    xf = x.float()
    if smooth_scale is not None:
        xf = xf * smooth_scale.float().reshape(1, -1)
    if quant_mode == "pertoken":
        xq, s = _pertoken_int8(xf)
    else:
        _check(x_scale is not None, f"{_QGMMD}: quant_mode pertensor needs x_scale")
        s = x_scale.float().reshape(-1)[:1].expand(x.size(0))
        xq = torch.round(xf / s[:, None]).clamp(-128, 127).to(torch.int8)
    rows = x.size(0)
    out = torch.zeros(rows, quantized_weight.size(1), dtype=torch.float32)
    for e, (start, end) in enumerate(_gmm_group_bounds(group_list.reshape(-1).tolist(), 0, rows)):
        if end > start:
            acc = xq[start:end].double() @ quantized_weight[e].double().t()
            out[start:end] = acc.float() * s[start:end, None] * weight_scale[e].float()
    return out.to(torch.float16)


def _qgmmd_meta(x, quantized_weight, weight_scale, group_list, **_):
    _qgmmd_checks(x, quantized_weight, weight_scale)
    return x.new_empty((x.shape[0], weight_scale.shape[1]), dtype=x.dtype)


SPECS = [
    OpSpec(generated(_V1), npu_grouped_matmul_swiglu_quant, mix(), meta=_v1_meta),
    OpSpec(generated(_V2), npu_grouped_matmul_swiglu_quant_v2, mix(), meta=_v2_meta),
    OpSpec(generated(_QGMMD), npu_quant_grouped_matmul_dequant, mix(), meta=_qgmmd_meta),
]
