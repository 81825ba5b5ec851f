"""Grouped matmul: npu_grouped_matmul (tensor and list group_list overloads) and
npu_grouped_matmul_finalize_routing (grouped matmul scatter-added into the tokens: MoE combine)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ._common import _ENUM_OF_DTYPE, _check, _dtype_of, _dtype_str, _quant_round, _scale_values, _unsupported
from .spec import OpSpec, mix


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


_GMM_COMMON = (
    "Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, Tensor[]? offset=None, "
    "Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, ")
_GMM_ACTIVATION = (
    "Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, "
    "Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=None, int? group_list_type=0, "
    "int? act_type=0, ")


# ----------------------------------------------------------------------------- grouped_matmul_finalize_routing
_GMMFR = "npu_grouped_matmul_finalize_routing"


def _gmmfr_checks(x, w, dtype, shared_input, logit) -> None:
    _check(x.dim() == 2 and w.dim() == 3, "x_dim should be 2 and w_dim should be 3.")
    dtype = torch.float32 if dtype is None else dtype
    if shared_input is not None and logit is not None:
        _check(dtype == torch.float32,
               lambda: "When shared_input is not None, output_dtype must be float32, but it is " + str(dtype))
    if dtype != torch.float32:
        raise RuntimeError("Not supportted output dtype is " + str(dtype))


def npu_grouped_matmul_finalize_routing(
        x: torch.Tensor, w: torch.Tensor, group_list: torch.Tensor, *, scale: Optional[torch.Tensor] = None,
        bias: Optional[torch.Tensor] = None, offset: Optional[torch.Tensor] = None,
        pertoken_scale: Optional[torch.Tensor] = None, shared_input: Optional[torch.Tensor] = None,
        logit: Optional[torch.Tensor] = None, row_index: Optional[torch.Tensor] = None,
        dtype: Optional[torch.dtype] = None, shared_input_weight: Optional[float] = 1.0,
        shared_input_offset: Optional[int] = 0, output_bs: Optional[int] = 0, group_list_type: Optional[int] = 1,
        tuning_config: Optional[Sequence[int]] = None, x_dtype: Optional[int] = None, w_dtype: Optional[int] = None,
        scale_dtype: Optional[int] = None, pertoken_scale_dtype: Optional[int] = None) -> torch.Tensor:
    """Grouped matmul whose rows are scattered-added into the token output (MoE combine).

    Rows of group g (``group_list``: counts for type 1, cumulative ends for type 0) compute
    ``h_m = (x_m @ w[g]) * scale[g] * pertoken_scale[m]`` (int8 operands accumulate exactly;
    float operands are a plain matmul), then ``out[row_index[m]] += logit[m] * h_m``.  Rows
    past the groups are ignored.  ``shared_input * shared_input_weight`` is added to rows
    ``[shared_input_offset, +len)``.  ``out`` is float32 ``(output_bs or M, N)``.
    """
    _gmmfr_checks(x, w, dtype, shared_input, logit)
    for name, value in (("x_dtype", x_dtype), ("w_dtype", w_dtype), ("scale_dtype", scale_dtype),
                        ("pertoken_scale_dtype", pertoken_scale_dtype), ("bias", bias), ("offset", offset)):
        if value is not None:
            raise _unsupported(_GMMFR, f"{name} (A8W4 / MX formats)")
    if w.dtype == torch.int32:
        raise _unsupported(_GMMFR, "int4 (int32-packed) weight")
    m, n = x.size(0), w.size(-1)
    counts = group_list.to(torch.int64).reshape(-1)
    ends = counts.cumsum(0) if (group_list_type if group_list_type is not None else 1) == 1 else counts
    _check(ends.numel() == w.size(0),
           lambda: f"{_GMMFR}: group_list has {ends.numel()} groups but w has {w.size(0)} experts")
    rows = int(ends[-1]) if ends.numel() else 0
    _check(0 <= rows <= m and bool((ends[1:] >= ends[:-1]).all()),
           lambda: f"{_GMMFR}: group_list must be non-negative with a total <= {m}, but got {group_list.tolist()}")
    group = torch.searchsorted(ends, torch.arange(rows), right=True)
    compute = torch.float64 if x.dtype == torch.int8 and w.dtype == torch.int8 else torch.float32
    h = torch.zeros(rows, n, dtype=torch.float32)
    for g, (lo, hi) in enumerate(zip([0] + ends[:-1].tolist(), ends.tolist())):
        h[lo:hi] = (x[lo:hi].to(compute) @ w[g].to(compute)).to(torch.float32)
    if scale is not None:
        h = h * _scale_values(scale).reshape(w.size(0), -1)[group]
    if pertoken_scale is not None:
        h = h * pertoken_scale.to(torch.float32).reshape(-1)[:rows].unsqueeze(-1)
    if logit is not None:
        h = h * logit.to(torch.float32).reshape(-1)[:rows].unsqueeze(-1)
    out_rows = output_bs or m
    out = torch.zeros(out_rows, n, dtype=torch.float32)
    dest = row_index.to(torch.int64).reshape(-1)[:rows] if row_index is not None else torch.arange(rows)
    out.index_add_(0, dest, h)
    if shared_input is not None:
        start = shared_input_offset or 0
        weight = 1.0 if shared_input_weight is None else shared_input_weight
        out[start:start + shared_input.size(0)] += shared_input.to(torch.float32) * weight
    return out


def _gmmfr_meta(x, w, group_list, *, scale=None, bias=None, offset=None, pertoken_scale=None, shared_input=None,
                logit=None, row_index=None, dtype=None, shared_input_weight=1.0, shared_input_offset=0,
                output_bs=0, group_list_type=1, tuning_config=None, x_dtype=None, w_dtype=None, scale_dtype=None,
                pertoken_scale_dtype=None):
    _gmmfr_checks(x, w, dtype, shared_input, logit)
    n = w.size(-1) * 8 if w.dtype == torch.int32 else w.size(-1)
    return x.new_empty((output_bs or x.size(0), n), dtype=torch.float32)


SPECS = [
    OpSpec("npu_grouped_matmul(" + _GMM_COMMON + "Tensor? group_list=None, " + _GMM_ACTIVATION
           + "int[]? tuning_config=None, int? output_dtype=None, int? x_dtype=None, int? weight_dtype=None, "
           "int? scale_dtype=None, int? per_token_scale_dtype=None) -> Tensor[]", npu_grouped_matmul, mix()),
    OpSpec("npu_grouped_matmul.List(" + _GMM_COMMON + "int[]? group_list=None, " + _GMM_ACTIVATION
           + "ScalarType? output_dtype=None) -> Tensor[]", npu_grouped_matmul_list, mix()),
    OpSpec("npu_grouped_matmul_finalize_routing(Tensor x, Tensor w, Tensor group_list, *, Tensor? scale=None, "
           "Tensor? bias=None, Tensor? offset=None, Tensor? pertoken_scale=None, Tensor? shared_input=None, "
           "Tensor? logit=None, Tensor? row_index=None, ScalarType? dtype=None, float? shared_input_weight=1.0, "
           "int? shared_input_offset=0, int? output_bs=0, int? group_list_type=1, int[]? tuning_config=None, "
           "int? x_dtype=None, int? w_dtype=None, int? scale_dtype=None, int? pertoken_scale_dtype=None) -> Tensor",
           npu_grouped_matmul_finalize_routing, mix(), meta=_gmmfr_meta),
]
