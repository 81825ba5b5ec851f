"""Norms and activations: npu_swiglu, npu_fast_gelu (and fast_gelu, npu_fast_gelu_backward), npu_rms_norm, npu_add_rms_norm (and v2, in place), and the
residual-add norms fused with quantisation: npu_add_rms_norm_quant (static quant of the norm output),
npu_add_rms_norm_dynamic_quant (per-row dynamic quant, up to two smoothed outputs), npu_add_layer_norm.

The fused ops follow torch_npu 2.14.0's docstrings and the CANN aclnn docs of the same kernels; their
shapes and argument checks the wheel's meta registrations.  Quantised values round half to even and
saturate, as the NPU's rint cast does.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ._common import _ENUM_TO_DTYPE, HIFLOAT8, INT4, _check, _dtype_str, _quant_round, _unsupported, pack_int4
from .spec import OpSpec, generated, vector


# ----------------------------------------------------------------------------- elementwise / norms
def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``A * sigmoid(A) * B`` with A, B the first and second halves of ``self`` along ``dim``."""
    half = self.size(dim) // 2
    a = self.narrow(dim, 0, half).to(torch.float32)
    b = self.narrow(dim, half, half).to(torch.float32)
    return (F.silu(a) * b).to(self.dtype)


_FAST_GELU_DTYPES = (torch.float16, torch.float32, torch.bfloat16)
_FAST_GELU_ALPHA = 1.702


def _fast_gelu_input(x: torch.Tensor, op: str) -> torch.Tensor:
    _check(x.dtype in _FAST_GELU_DTYPES,
           lambda: f"{op}: input dtype {x.dtype} is not supported (float16, float32 and bfloat16 are)")
    _check(x.dim() <= 8, lambda: f"{op}: input may have at most 8 dims, but got {x.dim()}")
    return x.to(torch.float32)


def npu_fast_gelu(self: torch.Tensor) -> torch.Tensor:
    """FastGelu, ``x / (1 + exp(-1.702 x))``.

    torch_npu's doc gives two formulas: ``x / (1 + exp(-1.702|x|)) * exp(0.851 x (x - |x|))`` (Atlas
    training/inference series; the ``x`` after 0.851 is a multiplication sign, as in CANN's FastGelu
    formula) and ``x / (1 + exp(-1.702 x))`` (A2/A3).  For ``x < 0`` the first is the second with
    numerator and denominator multiplied by ``exp(1.702 x)``: both are ``x * sigmoid(1.702 x)``, computed
    here through ``sigmoid`` (no overflow) whatever the chip.
    """
    x = _fast_gelu_input(self, "npu_fast_gelu")
    return (x * torch.sigmoid(_FAST_GELU_ALPHA * x)).to(self.dtype)


def fast_gelu(self: torch.Tensor) -> torch.Tensor:
    """``torch_npu.fast_gelu``: the same FastGelu kernel as ``npu_fast_gelu``."""
    x = _fast_gelu_input(self, "fast_gelu")
    return (x * torch.sigmoid(_FAST_GELU_ALPHA * x)).to(self.dtype)


def npu_fast_gelu_backward(grad: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    """FastGeluGrad: ``grad * d/dx[x * sigmoid(1.702 x)] = grad * s * (1 + 1.702 x (1 - s))``, s = sigmoid(1.702 x)."""
    x = _fast_gelu_input(self, "npu_fast_gelu_backward")
    _check(grad.shape == self.shape, lambda: f"npu_fast_gelu_backward: grad shape {list(grad.shape)} must match "
                                             f"self shape {list(self.shape)}")
    s = torch.sigmoid(_FAST_GELU_ALPHA * x)
    return (grad.to(torch.float32) * s * (1 + _FAST_GELU_ALPHA * x * (1 - s))).to(self.dtype)


def _fast_gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _fast_gelu_grad(ctx, grad):
    self, = ctx.saved_tensors
    return torch.ops.npu.npu_fast_gelu_backward(grad, self)


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """RMS norm over the trailing ``gamma.dim()`` dims; returns (y, rstd) with rstd float32."""
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    x = self.to(torch.float32)
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (x * rstd * gamma.to(torch.float32)).to(self.dtype), rstd


def npu_rms_norm_backward(dy: torch.Tensor, self: torch.Tensor, gamma: torch.Tensor, rstd: torch.Tensor):
    """Gradients of ``npu_rms_norm``'s y = x * rstd * gamma: (dx in self's dtype, dgamma in float32,
    gamma's shape), rstd being the forward's second output."""
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    x_hat = self.to(torch.float32) * rstd
    dx_hat = dy.to(torch.float32) * gamma.to(torch.float32)
    dx = rstd * (dx_hat - x_hat * (dx_hat * x_hat).mean(dim=dims, keepdim=True))
    dgamma = (dy.to(torch.float32) * x_hat).reshape(-1, *gamma.shape).sum(dim=0)
    return dx.to(self.dtype), dgamma


def _rms_norm_setup(ctx, inputs, output):
    self, gamma, _epsilon = inputs
    ctx.save_for_backward(self, gamma, output[1])


def _rms_norm_grad(ctx, grad_y, _grad_rstd):
    """torch_npu's NpuRmsNormBackward0: y's gradient through npu_rms_norm_backward; rstd is not
    differentiated."""
    self, gamma, rstd = ctx.saved_tensors
    dx, dgamma = torch.ops.npu.npu_rms_norm_backward(grad_y, self, gamma, rstd)
    return dx, dgamma, None


def _rms_norm_backward_meta(dy, self, gamma, rstd):
    return torch.empty_like(self), torch.empty_like(gamma, dtype=torch.float32)


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """Residual add fused with RMS norm; returns (rms_norm(x1+x2)*gamma, rstd, x1+x2)."""
    total = x1.to(torch.float32) + x2.to(torch.float32)
    y, rstd = npu_rms_norm(total, gamma, epsilon)
    return y.to(x1.dtype), rstd, total.to(x1.dtype)


def npu_add_rms_norm_cast(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """AddRmsNormCast (aclnnAddRmsNormCast): ``npu_add_rms_norm`` with the cast of its result fused in;
    returns ``(float32(y), y, rstd, x1+x2)``, y in x1's dtype (float16 or bfloat16), as the doc's
    ``y1 = float(y2)``: the float32 output is the rounded half-precision result widened."""
    _check(x1.dtype in (torch.float16, torch.bfloat16),
           lambda: f"npu_add_rms_norm_cast: x1 must be float16 or bfloat16, got {x1.dtype}")
    _check(x2.dtype == x1.dtype and gamma.dtype == x1.dtype,
           lambda: f"npu_add_rms_norm_cast: x2 and gamma must be {x1.dtype} as x1, got {x2.dtype} and {gamma.dtype}")
    y, rstd, total = npu_add_rms_norm(x1, x2, gamma, epsilon)
    return y.to(torch.float32), y, rstd, total


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




def _norm_dims(x: torch.Tensor, gamma: torch.Tensor) -> tuple:
    return tuple(range(x.dim() - gamma.dim(), x.dim()))


def _stat_shape(x: torch.Tensor, gamma: torch.Tensor) -> list:
    """``x.shape`` with the normalised (trailing ``gamma.dim()``) dims set to 1."""
    keep = x.dim() - gamma.dim()
    return [x.size(i) if i < keep else 1 for i in range(x.dim())]


def _rms(x: torch.Tensor, gamma: torch.Tensor, beta: Optional[torch.Tensor], epsilon: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * gamma (+ beta)`` over the trailing gamma dims, float32."""
    rstd = torch.rsqrt(x.pow(2).mean(dim=_norm_dims(x, gamma), keepdim=True) + epsilon)
    y = x * rstd * gamma.to(torch.float32)
    return y if beta is None else y + beta.to(torch.float32)


# ----------------------------------------------------------------------------- add_rms_norm_quant
def _quant_dtype(dst_type) -> torch.dtype:
    """The output dtype the meta kernel gives for ``dst_type`` (None: int8; unknown: int8)."""
    if dst_type is None:
        return torch.int8
    if isinstance(dst_type, torch.dtype):
        return dst_type
    return _ENUM_TO_DTYPE.get(int(dst_type), torch.uint8 if int(dst_type) in (INT4, HIFLOAT8) else torch.int8)


def npu_add_rms_norm_quant(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, scales1: torch.Tensor,
                           zero_points1: Optional[torch.Tensor], beta: Optional[torch.Tensor] = None,
                           scales2: Optional[torch.Tensor] = None, zero_points2: Optional[torch.Tensor] = None, *,
                           axis: int = -1, epsilon: float = 1e-06, div_mode: bool = True, dst_type: Optional[int] = None):
    """``x = x1 + x2``; ``y = rms_norm(x) * gamma + beta``; ``y_i = round(y / scales_i + zero_points_i)``
    (``y * scales_i`` when ``div_mode`` is False), saturated to int8.  Returns ``(y1, y2, x)``;
    ``y2`` is only computed when ``scales2`` is given (zeros otherwise, as the kernel leaves it unset).
    """
    _check(axis == -1, lambda: f"axis should be -1, but got {axis}.")
    if _quant_dtype(dst_type) != torch.int8:
        raise _unsupported("npu_add_rms_norm_quant", f"dst_type {_dtype_str(dst_type)}")
    total = x1.to(torch.float32) + x2.to(torch.float32)
    y = _rms(total, gamma, beta, epsilon)

    def quantise(scales, zero_points):
        s = scales.to(torch.float32)
        q = y / s if div_mode else y * s
        if zero_points is not None:
            q = q + zero_points.to(torch.float32)
        return _quant_round(q, 127.0)

    y1 = quantise(scales1, zero_points1)
    y2 = quantise(scales2, zero_points2) if scales2 is not None else torch.zeros_like(y1)
    return y1, y2, total.to(x1.dtype)


def _add_rms_norm_quant_meta(x1, x2, gamma, scales1, zero_points1, beta=None, scales2=None, zero_points2=None, *,
                             axis=-1, epsilon=1e-06, div_mode=True, dst_type=None):
    _check(axis == -1, lambda: f"axis should be -1, but got {axis}.")
    dtype = _quant_dtype(dst_type)
    return x1.new_empty(x1.shape, dtype=dtype), x1.new_empty(x1.shape, dtype=dtype), x1.new_empty(x1.shape)


# ----------------------------------------------------------------------------- add_rms_norm_dynamic_quant
def _dynamic_outputs(smooth_scale1, smooth_scale2, output_mask) -> tuple:
    """Which of y1/y2 the op produces (the meta kernel's rule, and the doc's constraints)."""
    if output_mask is None or len(output_mask) == 0:
        _check(not (smooth_scale2 is not None and smooth_scale1 is None),
               "npu_add_rms_norm_dynamic_quant: when output_mask is empty, smooth_scale2 needs smooth_scale1")
        return True, smooth_scale1 is not None and smooth_scale2 is not None
    if not output_mask[0] and not output_mask[1]:
        raise RuntimeError("When the output_mask is not empty, at least one of y1 and y2 must be output. ")
    _check(smooth_scale1 is None or output_mask[0],
           "npu_add_rms_norm_dynamic_quant: output_mask[0] must be True when smooth_scale1 is given")
    _check(smooth_scale2 is None or output_mask[1],
           "npu_add_rms_norm_dynamic_quant: output_mask[1] must be True when smooth_scale2 is given")
    return bool(output_mask[0]), bool(output_mask[1])


def _dynamic_y_dtype(y_dtype):
    """(storage dtype, packed int4?) of y1/y2 for ``y_dtype``, as the meta kernel derives it."""
    if y_dtype is None:
        return torch.int8, False
    if isinstance(y_dtype, torch.dtype):
        dtype = y_dtype
    else:
        if int(y_dtype) == INT4:
            return torch.int32, True
        dtype = _ENUM_TO_DTYPE.get(int(y_dtype))
        if dtype is None and int(y_dtype) != HIFLOAT8:
            raise RuntimeError(f"Parameter y_dtype enum value:{y_dtype} not found in "
                               "TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP")
        if int(y_dtype) == HIFLOAT8:
            return torch.uint8, False
    if dtype == torch.quint4x2:
        return torch.int32, True
    return dtype, False


def npu_add_rms_norm_dynamic_quant(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, *,
                                   smooth_scale1: Optional[torch.Tensor] = None,
                                   smooth_scale2: Optional[torch.Tensor] = None, beta: Optional[torch.Tensor] = None,
                                   epsilon: float = 1e-6, output_mask: Optional[Sequence[bool]] = None,
                                   y_dtype: Optional[int] = None):
    """``x = x1 + x2``; ``y = rms_norm(x) * gamma + beta``; for each produced path i:
    ``t = y * smooth_scale_i``, ``scale_i = rowmax|t| / 127`` (7 for int4), ``y_i = round(t / scale_i)``.

    Returns ``(y1, y2, x, scale1, scale2)``; a path that is not produced is an empty ``(0,)``
    tensor.  int4 output packs eight values per int32 along the last dim.
    """
    out1, out2 = _dynamic_outputs(smooth_scale1, smooth_scale2, output_mask)
    storage, packed = _dynamic_y_dtype(y_dtype)
    if storage not in (torch.int8, torch.int32):
        raise _unsupported("npu_add_rms_norm_dynamic_quant", f"y_dtype {_dtype_str(y_dtype)}")
    if packed:
        _check(x1.size(-1) % 8 == 0, "npu_add_rms_norm_dynamic_quant: int4 output needs the last dim of x1 "
                                         "to be divisible by 8")
    bound = 7.0 if packed else 127.0
    total = x1.to(torch.float32) + x2.to(torch.float32)
    y = _rms(total, gamma, beta, epsilon)

    def path(produced, smooth):
        if not produced:
            return torch.zeros(0, dtype=storage), torch.zeros(0, dtype=torch.float32)
        t = y if smooth is None else y * smooth.to(torch.float32)
        scale = t.abs().amax(dim=-1) / bound
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = _quant_round(t / safe.unsqueeze(-1), bound)
        return (pack_int4(q) if packed else q), scale

    y1, scale1 = path(out1, smooth_scale1)
    y2, scale2 = path(out2, smooth_scale2)
    return y1, y2, total.to(x1.dtype), scale1, scale2


def _add_rms_norm_dynamic_quant_meta(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None, beta=None,
                                     epsilon=1e-6, output_mask=None, y_dtype=None):
    out1, out2 = _dynamic_outputs(smooth_scale1, smooth_scale2, output_mask)
    storage, packed = _dynamic_y_dtype(y_dtype)
    y_shape = list(x1.shape)
    if packed:
        y_shape[-1] = y_shape[-1] // 8
    rows = list(x1.shape[:-1])
    return (x1.new_empty(y_shape if out1 else [0], dtype=storage),
            x1.new_empty(y_shape if out2 else [0], dtype=storage),
            x1.new_empty(x1.shape),
            x1.new_empty(rows if out1 else [0], dtype=torch.float32),
            x1.new_empty(rows if out2 else [0], dtype=torch.float32))


# ----------------------------------------------------------------------------- add_layer_norm
def npu_add_layer_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
                       epsilon: float = 1e-05, additional_output: bool = False):
    """``x = x1 + x2``; layer norm over the trailing ``gamma.dim()`` dims:
    ``y = (x - mean) * rstd * gamma + beta`` with the biased variance.  Returns
    ``(y, mean, rstd, x)``; mean and rstd are float32 with the normalised dims kept as 1.
    """
    total = x1.to(torch.float32) + x2.to(torch.float32)
    dims = _norm_dims(total, gamma)
    mean = total.mean(dim=dims, keepdim=True)
    var = (total - mean).pow(2).mean(dim=dims, keepdim=True)
    rstd = torch.rsqrt(var + epsilon)
    y = (total - mean) * rstd * gamma.to(torch.float32) + beta.to(torch.float32)
    return y.to(x1.dtype), mean, rstd, total.to(x1.dtype)


def _add_layer_norm_meta(x1, x2, gamma, beta, epsilon=1e-05, additional_output=False):
    stat = _stat_shape(x1, gamma)
    return (x1.new_empty(x1.shape), x1.new_empty(stat, dtype=torch.float32),
            x1.new_empty(stat, dtype=torch.float32), x1.new_empty(x1.shape))


SPECS = [
    OpSpec("npu_swiglu(Tensor self, int dim=-1) -> Tensor", npu_swiglu, vector()),
    # Both FastGelu ops have torch_npu autograd formulas (NpuFastGeluBackward0, FastGeluBackward0).
    OpSpec(generated("npu_fast_gelu"), npu_fast_gelu, vector(), autograd=(_fast_gelu_setup, _fast_gelu_grad)),
    OpSpec(generated("fast_gelu"), fast_gelu, vector(), autograd=(_fast_gelu_setup, _fast_gelu_grad)),
    OpSpec(generated("npu_fast_gelu_backward"), npu_fast_gelu_backward, vector()),
    OpSpec("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
           npu_rms_norm, vector(), autograd=(_rms_norm_setup, _rms_norm_grad)),
    OpSpec("npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor)",
           npu_rms_norm_backward, vector(), meta=_rms_norm_backward_meta),
    OpSpec("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
           npu_add_rms_norm, vector()),
    OpSpec(generated("npu_add_rms_norm_cast"), npu_add_rms_norm_cast, vector()),
    # In place: x1 <- rms_norm(x1+x2)*gamma, x2 <- x1+x2.  Functionalization rewrites it to the
    # _functional variant (library._add_functionalization), as torch_npu's codegen does.
    OpSpec("npu_add_rms_norm_v2(Tensor(a!) x1, Tensor(b!) x2, Tensor gamma, float epsilon=1e-06) -> Tensor",
           npu_add_rms_norm_v2, vector()),
    OpSpec("npu_add_rms_norm_v2_functional(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
           "-> (Tensor, Tensor, Tensor)", npu_add_rms_norm_v2_functional, vector(),
           reinplace=("npu_add_rms_norm_v2", (0, 1))),
    OpSpec("npu_add_rms_norm_quant(Tensor x1, Tensor x2, Tensor gamma, Tensor scales1, Tensor? zero_points1, "
           "Tensor? beta=None, Tensor? scales2=None, Tensor? zero_points2=None, *, int axis=-1, "
           "float epsilon=1e-06, bool div_mode=True, int? dst_type=None) -> (Tensor, Tensor, Tensor)",
           npu_add_rms_norm_quant, vector(), meta=_add_rms_norm_quant_meta),
    OpSpec("npu_add_rms_norm_dynamic_quant(Tensor x1, Tensor x2, Tensor gamma, *, Tensor? smooth_scale1=None, "
           "Tensor? smooth_scale2=None, Tensor? beta=None, float epsilon=1e-6, bool[2]? output_mask=None, "
           "int? y_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
           npu_add_rms_norm_dynamic_quant, vector(), meta=_add_rms_norm_dynamic_quant_meta),
    OpSpec("npu_add_layer_norm(Tensor x1, Tensor x2, Tensor gamma, Tensor beta, float epsilon=1e-05, "
           "bool additional_output=False) -> (Tensor, Tensor, Tensor, Tensor)",
           npu_add_layer_norm, vector(), meta=_add_layer_norm_meta),
]
