"""Batched matmuls with fused transposes, and the ATB matmul that accumulates into fp32:
npu_transpose_batchmatmul, npu_transpose_quant_batchmatmul, _npu_matmul_add_fp32.

Who calls them: vLLM-Ascend's MLA/SFA/DSA attention (``npu_transpose_batchmatmul(x, W_UV, perm_x1=(1, 0, 2),
perm_y=(1, 0, 2))``: the per-head up-projection of the latent output, batch = heads, with the [tokens, heads]
transposes fused into the kernel; the quant form on Ascend 950 with MX scales), and its worker's ATB warm-up
(``_npu_matmul_add_fp32(x, weight, C)``, the fused weight-gradient accumulation).

* ``npu_transpose_batchmatmul``: ``x1.permute(perm_x1)`` is [B, M, K], ``x2.permute(perm_x2)`` [B, K, N];
  ``y = bmm`` [B, M, N] is returned permuted by ``perm_y`` (only [1, 0, 2]: [M, B, N]).  With ``scale``
  (``npu_trans_quant_param``'s int64 packing, one value per B*N output column) y is requantised to int8
  [M, 1, B*N]; ``batch_split_factor`` s > 1 returns the [M, B*N] result as s slices [s, M, B*N/s].
  Argument errors are the wheel's meta checks (CANN >= 8.5: perm_x2 may be [0, 2, 1]).
* ``npu_transpose_quant_batchmatmul``: the same transposes on quantised operands, output dtype ``dtype``:
  per-token/per-channel float scales (x1_scale [M], x2_scale [N] or [B, N]) or, with ``group_sizes``
  (0, 0, g), MX scales: float8_e8m0 exponent bytes, one per g values of K, stored in pairs as
  ``npu_dynamic_mx_quant`` writes them (x1_scale [M, B, K/2g, 2] in x1's layout, x2_scale [B, K/2g, N, 2]).
* ``_npu_matmul_add_fp32``: ``C += x^T @ weight`` accumulated in float32 (x [m, k1], weight [m, k2], C
  [k1, k2] float32), as Megatron-style gradient accumulation (``main_grad += input^T @ grad_output``).
"""
from __future__ import annotations

import torch

from ._common import _check, _dtype_of, _quant_round, _scale_values, _unsupported
from .spec import OpSpec, cores, cube, generated, mix

_FLOATS = (torch.float16, torch.float32, torch.bfloat16)


def _perm_checks(perm_x1, perm_x2, perm_y):
    perm_x1 = list(perm_x1 or [0, 1, 2])
    perm_x2 = list(perm_x2 or [0, 1, 2])
    perm_y = list(perm_y or [1, 0, 2])
    _check(perm_x1 in ([0, 1, 2], [1, 0, 2]), "perm_x1 should be [0, 1, 2] or [1, 0, 2]")
    _check(perm_x2 in ([0, 1, 2], [0, 2, 1]), "perm_x2 should be [0, 1, 2] or [0, 2, 1]")
    _check(perm_y == [1, 0, 2], "perm_y should be [1, 0, 2]")
    return perm_x1, perm_x2, perm_y


def _operands(op, input, weight, perm_x1, perm_x2):
    _check(input.dim() == 3 and weight.dim() == 3,
           lambda: f"{op}: input and weight must be 3-dimensional, but got {input.dim()} and {weight.dim()} dims")
    a, b = input.permute(perm_x1), weight.permute(perm_x2)          # [B, M, K], [B, K, N]
    _check(a.size(0) == b.size(0) and a.size(2) == b.size(1),
           lambda: f"{op}: input permuted by perm_x1 {list(a.shape)} (B, M, K) and weight permuted by perm_x2 "
                   f"{list(b.shape)} (B, K, N) do not match")
    return a, b


def _split(y: torch.Tensor, batch_split_factor) -> torch.Tensor:
    """[M, B, N] -> [s, M, B*N/s] (s = batch_split_factor > 1)."""
    s = batch_split_factor or 1
    if s <= 1:
        return y
    m = y.size(0)
    _check(y.size(1) * y.size(2) % s == 0,
           lambda: f"batch_split_factor {s} must divide batch * N = {y.size(1) * y.size(2)}")
    return y.reshape(m, s, -1).permute(1, 0, 2).contiguous()


def _float_operands(input, weight, bias) -> None:
    """TransposeBatchMatMul's operand checks (the math and the meta kernel ask the same)."""
    _check(input.dtype in _FLOATS, lambda: "input's type supported for float16, float32 and bfloat16, but now is "
                                           f"{input.dtype}")
    _check(weight.dtype in _FLOATS, lambda: "weight's type supported for float16, float32 and bfloat16, but now is "
                                            f"{weight.dtype}")
    _check(bias is None, "The bias is not supported in TransposeBatchMatMul")


def npu_transpose_batchmatmul(input, weight, *, bias=None, scale=None, perm_x1=None, perm_x2=None, perm_y=None,
                              batch_split_factor=1):
    perm_x1, perm_x2, perm_y = _perm_checks(perm_x1, perm_x2, perm_y)
    _float_operands(input, weight, bias)
    a, b = _operands("npu_transpose_batchmatmul", input, weight, perm_x1, perm_x2)
    y = torch.bmm(a.float(), b.float()).permute(perm_y)            # [M, B, N] float32
    if scale is not None:
        m, batch, n = y.shape
        values = _scale_values(scale).reshape(-1)
        _check(values.numel() in (1, batch * n),
               lambda: f"npu_transpose_batchmatmul: scale must hold 1 or batch * N = {batch * n} values, but got "
                       f"{values.numel()}")
        q = _quant_round(y.reshape(m, 1, batch * n) * values, 127.0)
        return _split(q.reshape(m, batch, n), batch_split_factor) if (batch_split_factor or 1) > 1 else q
    return _split(y.to(input.dtype), batch_split_factor)


def _transpose_batchmatmul_meta(input, weight, *, bias=None, scale=None, perm_x1=None, perm_x2=None, perm_y=None,
                                batch_split_factor=1):
    perm_x1, perm_x2, _ = _perm_checks(perm_x1, perm_x2, perm_y)
    _float_operands(input, weight, bias)
    m, batch, n = input.size(perm_x1.index(1)), input.size(perm_x1.index(0)), weight.size(perm_x2.index(2))
    dims, dtype = (m, batch, n), input.dtype
    if scale is not None:
        dims, dtype = (m, 1, batch * n), torch.int8
    if (batch_split_factor or 1) > 1:
        dims = (batch_split_factor, m, batch * n // batch_split_factor)
    return input.new_empty(dims, dtype=dtype)


# ------------------------------------------------------------------ npu_transpose_quant_batchmatmul
_TQBMM = "npu_transpose_quant_batchmatmul"


def _e8m0(scale: torch.Tensor) -> torch.Tensor:
    """float8_e8m0 exponent bytes (uint8 or float8_e8m0fnu) -> float32 powers of two."""
    raw = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    return torch.exp2(raw.to(torch.float32) - 127.0)


def _operand_values(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or t.is_floating_point():
        return t.to(torch.float32)
    if t.dtype == torch.int8:
        return t.to(torch.float32)
    raise _unsupported(_TQBMM, f"operands of dtype {t.dtype}")


def npu_transpose_quant_batchmatmul(x1, x2, dtype, *, bias=None, x1_scale=None, x2_scale=None, group_sizes=None,
                                    perm_x1=None, perm_x2=None, perm_y=None, batch_split_factor=1, x1_dtype=None,
                                    x2_dtype=None):
    out_dtype = _dtype_of(dtype)
    _check(out_dtype in (torch.float16, torch.bfloat16, torch.float32),
           lambda: f"Not supported output dtype is {dtype}")
    if x1_dtype is not None or x2_dtype is not None:
        raise _unsupported(_TQBMM, "x1_dtype / x2_dtype (FP4/HiFloat8 operands)")
    perm_x1, perm_x2, perm_y = _perm_checks(perm_x1, perm_x2, perm_y)
    _check(x1_scale is not None and x2_scale is not None, f"{_TQBMM}: x1_scale and x2_scale are required")
    a, b = _operands(_TQBMM, x1, x2, perm_x1, perm_x2)                # [B, M, K], [B, K, N]
    af, bf = _operand_values(a), _operand_values(b)
    batch, m, k = af.shape
    n = bf.size(2)
    g = int(group_sizes[-1]) if group_sizes else 0
    if g:                                                            # MX: a 2**e scale per g values of K
        blocks = -(-k // g)
        s1 = _e8m0(x1_scale).reshape(*x1.shape[:2], -1).permute(perm_x1)[..., :blocks]     # [B, M, K/g]
        s2 = _e8m0(x2_scale).reshape(batch, -1, n, 2).permute(0, 1, 3, 2).reshape(batch, -1, n)[:, :blocks]
        af = af * s1.repeat_interleave(g, dim=-1)[..., :k]
        bf = bf * s2.repeat_interleave(g, dim=1)[:, :k]
        y = torch.bmm(af.double(), bf.double())
    else:                                                            # per-token x per-channel
        y = torch.bmm(af.double(), bf.double())
        s1 = x1_scale.double().reshape(-1)
        _check(s1.numel() in (1, m), lambda: f"{_TQBMM}: x1_scale must hold 1 or M = {m} values")
        s2 = x2_scale.double().reshape(-1)
        _check(s2.numel() in (1, n, batch * n), lambda: f"{_TQBMM}: x2_scale must hold 1, N or B*N values")
        y = y * s1.reshape(1, -1, 1) * (s2.reshape(batch, 1, n) if s2.numel() == batch * n else s2.reshape(1, 1, -1))
    if bias is not None:
        y = y + bias.double().reshape(-1, n) if bias.numel() != batch * n else y + bias.double().reshape(batch, 1, n)
    return _split(y.permute(perm_y).to(out_dtype), batch_split_factor)


def _transpose_quant_batchmatmul_meta(x1, x2, dtype, *, bias=None, x1_scale=None, x2_scale=None, group_sizes=None,
                                      perm_x1=None, perm_x2=None, perm_y=None, batch_split_factor=1, x1_dtype=None,
                                      x2_dtype=None):
    perm_x1, perm_x2, _ = _perm_checks(perm_x1, perm_x2, perm_y)
    m, batch, n = x1.size(perm_x1.index(1)), x1.size(perm_x1.index(0)), x2.size(perm_x2.index(2))
    dims = (m, batch, n)
    if (batch_split_factor or 1) > 1:
        dims = (batch_split_factor, m, batch * n // batch_split_factor)
    if dtype is None:
        raise RuntimeError("dtype can not be None")
    out = _dtype_of(dtype)
    if out is None:
        raise RuntimeError(f"Not supported output dtype is {dtype}")
    return x1.new_empty(dims, dtype=out)


# ------------------------------------------------------------------ _npu_matmul_add_fp32
def _npu_matmul_add_fp32(x, weight, C):
    op = "_npu_matmul_add_fp32"
    _check(x.dim() == 2 and weight.dim() == 2 and C.dim() == 2,
           lambda: f"{op}: x, weight and C must be 2-dimensional")
    _check(x.size(0) == weight.size(0) and tuple(C.shape) == (x.size(1), weight.size(1)),
           lambda: f"{op}: x {list(x.shape)} and weight {list(weight.shape)} must share dim 0 and C must be "
                   f"[{x.size(1)}, {weight.size(1)}], but got {list(C.shape)}")
    _check(C.dtype == torch.float32, lambda: f"{op}: C must be float32, but got {C.dtype}")
    C.add_(x.float().t() @ weight.float())


SPECS = [
    OpSpec(generated("npu_transpose_batchmatmul"), npu_transpose_batchmatmul, cube(),
           meta=_transpose_batchmatmul_meta),
    OpSpec(generated(_TQBMM), npu_transpose_quant_batchmatmul, mix(), meta=_transpose_quant_batchmatmul_meta),
    OpSpec(generated("_npu_matmul_add_fp32"), _npu_matmul_add_fp32, cores("ATB", cube="all"), namespace="atb",
           meta=lambda x, weight, C: None),
]
