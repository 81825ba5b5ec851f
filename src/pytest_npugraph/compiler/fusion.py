"""TorchAir's pattern fusion (``experimental_config.pattern_fusion_pass``, on by default; npugraph_ex's
``pattern_fusion_pass``): chains of torch_npu ops in the FX graph are replaced by the fused kernel
that computes them in one launch, before views become reshapes.  Users see the fused op in their
graphs (dumps, custom passes, traces) and one kernel where there were two or three.

The chains fused here (each with and without an explicit ``epsilon``):

* ``npu_add_rms_norm`` whose normalised output ``y`` is both used and cast to float32 (``y.to(float32)``
  or ``y.view(-1, h).to(float32)`` with ``h`` the last dim) -> ``npu_add_rms_norm_cast``, which gives
  ``float32(y)`` beside ``y``, ``rstd`` and ``x1 + x2``;
* ``npu_add_rms_norm`` followed by ``npu_dynamic_quant(y, smooth_scales=...)`` (the residual sum used or
  not) -> ``npu_add_rms_norm_dynamic_quant(..., smooth_scale1=..., output_mask=[True, False])``;
* ``npu_add_rms_norm`` followed by ``npu_dynamic_quant(y.flatten(0, 1))`` whose scale is viewed as
  ``(-1, 1)`` -> the same fused op, its outputs flattened and viewed as the chain's were.

A chain is fused only when all its ops run on one stream (a stream scope's label, or none); ops split
over streams stay as they are, as TorchAir's stream check keeps them.  TorchAir's other patterns
(``npu_add_rms_norm_quant``, the transposed batch matmuls of the aclgraph modes) are not applied.

The matching is torch's pattern matcher (``torch._inductor.pattern_matcher``), as TorchAir uses it."""
from __future__ import annotations

import functools
import logging
import operator

import torch

from . import fxgraph

log = logging.getLogger("torchair")


def _one_stream(match) -> bool:
    labels = {node.meta.get("stream_label") for node in match.nodes if node.op == "call_function"}
    if len(labels) > 1:
        log.debug("Cross-stream operation detected in pattern match; fusion is not supported for cross-stream "
                  "operations. Stream distribution: %s", labels)
        return False
    return True


def _shape(node):
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _norm_node(match):
    return next(n for n in match.nodes if n.target == torch.ops.npu.npu_add_rms_norm.default)


def _view_keeps_last_dim(match) -> bool:
    """``y.view(-1, h)`` with ``h`` y's last dim (the view only merges the leading dims)."""
    shape = _shape(_norm_node(match).args[0])
    view = next(n for n in match.nodes if n.target == torch.ops.aten.view.default)
    size = view.args[1]
    if shape is None or not isinstance(size, (list, tuple)) or len(size) != 2:
        return False
    last = size[1].meta.get("val") if isinstance(size[1], torch.fx.Node) else size[1]
    return str(last) == str(shape[-1])


def _view_merges_first_two(match) -> bool:
    """``npu_dynamic_quant``'s input is ``y.flatten(0, 1)`` (a view with one dim fewer, the first two merged)."""
    norm = _norm_node(match)
    shape = _shape(norm.args[0])
    view = next(n for n in match.nodes if n.target == torch.ops.aten.view.default and
                n.args[0].target is operator.getitem and n.args[0].args[0] is norm)
    size = view.args[1]
    if shape is None or len(shape) < 2 or not isinstance(size, (list, tuple)) or len(size) != len(shape) - 1:
        return False
    first = size[0]
    if isinstance(first, torch.fx.Node):
        return first.name.startswith("mul")       # a symbolic product of the two leading sizes
    return first == shape[0] * shape[1]


def _checked(*checks):
    def check(match) -> bool:
        return _one_stream(match) and all(c(match) for c in checks)
    return check


# ------------------------------------------------------------------------------------ replacements
# (the pattern matcher traces a replacement with exactly the pattern's arguments: no defaults)
def _cast_fused(x1, x2, gamma, *epsilon):
    y_cast, y, _, total = torch.ops.npu.npu_add_rms_norm_cast.default(x1, x2, gamma, *epsilon)
    return y, total, y_cast


def _cast_fused_view(x1, x2, gamma, *epsilon):
    y, total, y_cast = _cast_fused(x1, x2, gamma, *epsilon)
    return y, total, y_cast.view(-1, y.size(-1))


def _quant_fused(x1, x2, gamma, smooth_scales=None, epsilon=None):
    kwargs = {"output_mask": [True, False]}
    if smooth_scales is not None:
        kwargs["smooth_scale1"] = smooth_scales
    if epsilon is not None:
        kwargs["epsilon"] = epsilon
    y, _, total, scale, _ = torch.ops.npu.npu_add_rms_norm_dynamic_quant.default(x1, x2, gamma, **kwargs)
    return y, total, scale


def _flat_quant_fused(x1, x2, gamma, *epsilon):
    y, total, scale = _quant_fused(x1, x2, gamma, epsilon=epsilon[0] if epsilon else None)
    return y.flatten(0, 1), scale.view(-1, 1), total


def _exact(fn, epsilon: bool):
    """``fn`` with the pattern's parameters only."""
    if epsilon:
        def replace(x1, x2, gamma, epsilon):
            return fn(x1, x2, gamma, epsilon)
    else:
        def replace(x1, x2, gamma):
            return fn(x1, x2, gamma)
    return replace


# --------------------------------------------------------------------------------------- patterns
def _norm_call(epsilon: bool, users: int):
    from torch._inductor.pattern_matcher import CallFunction, KeywordArg

    args = [KeywordArg("x1"), KeywordArg("x2"), KeywordArg("gamma")] + ([KeywordArg("epsilon")] if epsilon else [])
    return CallFunction(torch.ops.npu.npu_add_rms_norm.default, *args, _users=users)


def _cast_pattern(epsilon: bool, view: bool, to_copy: bool):
    """y (used and cast), x1+x2, float32(y) [through view(-1, h)]."""
    from torch._inductor.pattern_matcher import CallFunction, Ignored, MultiOutputPattern

    norm = _norm_call(epsilon, 2)
    y = CallFunction(operator.getitem, norm, 0, _users=2)
    total = CallFunction(operator.getitem, norm, 2)
    source = CallFunction(torch.ops.aten.view.default, y, [-1, Ignored()]) if view else y
    if to_copy:
        cast = CallFunction(torch.ops.aten._to_copy.default, source, dtype=torch.float32)
    else:
        cast = CallFunction(torch.ops.npu._npu_dtype_cast.default, source, torch.float32)
    return MultiOutputPattern([y, total, cast])


def _flat_quant_pattern(epsilon: bool):
    """quantised y.flatten(0, 1), its scale viewed (-1, 1), x1+x2."""
    from torch._inductor.pattern_matcher import CallFunction, Ignored, MultiOutputPattern

    norm = _norm_call(epsilon, 2)
    y = CallFunction(operator.getitem, norm, 0)
    total = CallFunction(operator.getitem, norm, 2)
    quant = CallFunction(torch.ops.npu.npu_dynamic_quant.default,
                         CallFunction(torch.ops.aten.view.default, y, Ignored()), _users=2)
    return MultiOutputPattern([CallFunction(operator.getitem, quant, 0),
                               CallFunction(torch.ops.aten.view.default, CallFunction(operator.getitem, quant, 1),
                                            [-1, 1]),
                               total])


@functools.lru_cache(None)
def _patterns():
    """The pattern pass, built once per process (tracing the search functions takes a while)."""
    from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement
    from torch._subclasses.fake_tensor import FakeTensorMode

    patterns = PatternMatcherPass()
    eps = {"epsilon": 2e-6}

    def register(search, replace, inputs, check=_one_stream, pattern=None, scalars=None):
        register_replacement(search, replace, inputs, fwd_only, patterns, extra_check=check,
                             search_fn_pattern=pattern, scalar_workaround=scalars or {})

    def quant(x1, x2, gamma, smooth_scales):
        y, _, total = torch.ops.npu.npu_add_rms_norm.default(x1, x2, gamma)
        out, scale = torch.ops.npu.npu_dynamic_quant.default(y, smooth_scales=smooth_scales)
        return out, total, scale

    def quant_eps(x1, x2, gamma, smooth_scales, epsilon):
        y, _, total = torch.ops.npu.npu_add_rms_norm.default(x1, x2, gamma, epsilon)
        out, scale = torch.ops.npu.npu_dynamic_quant.default(y, smooth_scales=smooth_scales)
        return out, total, scale

    def quant_no_sum(x1, x2, gamma, smooth_scales):
        out, _, scale = quant(x1, x2, gamma, smooth_scales)
        return out, scale

    def quant_no_sum_eps(x1, x2, gamma, smooth_scales, epsilon):
        out, _, scale = quant_eps(x1, x2, gamma, smooth_scales, epsilon)
        return out, scale

    def fused(x1, x2, gamma, smooth_scales):
        return _quant_fused(x1, x2, gamma, smooth_scales)

    def fused_eps(x1, x2, gamma, smooth_scales, epsilon):
        return _quant_fused(x1, x2, gamma, smooth_scales, epsilon)

    def fused_no_sum(x1, x2, gamma, smooth_scales):
        out, _, scale = _quant_fused(x1, x2, gamma, smooth_scales)
        return out, scale

    def fused_no_sum_eps(x1, x2, gamma, smooth_scales, epsilon):
        out, _, scale = _quant_fused(x1, x2, gamma, smooth_scales, epsilon)
        return out, scale

    def given(x1, x2, gamma):               # the pattern is given: only the names are read
        raise AssertionError("not traced")

    def given_eps(x1, x2, gamma, epsilon):
        raise AssertionError("not traced")

    with FakeTensorMode():
        x = torch.empty(1, 1, 2, dtype=torch.float16)
        w = torch.empty(2, dtype=torch.float16)
        four, three = (x, x.clone(), w, w.clone()), (x, x.clone(), w)
        register(quant, fused, four)
        register(quant_eps, fused_eps, four, scalars=eps)
        register(quant_no_sum, fused_no_sum, four)
        register(quant_no_sum_eps, fused_no_sum_eps, four, scalars=eps)
        for to_copy in (True, False):
            for epsilon, search in ((False, given), (True, given_eps)):
                scalars = eps if epsilon else None
                register(search, _exact(_cast_fused_view, epsilon), three, _checked(_view_keeps_last_dim),
                         _cast_pattern(epsilon, True, to_copy), scalars)
                register(search, _exact(_cast_fused, epsilon), three, _one_stream,
                         _cast_pattern(epsilon, False, to_copy), scalars)
        for epsilon, search in ((False, given), (True, given_eps)):
            register(search, _exact(_flat_quant_fused, epsilon), three, _checked(_view_merges_first_two),
                     _flat_quant_pattern(epsilon), eps if epsilon else None)
    return patterns


def apply(gm) -> int:
    """Fuse the graph's chains in place; how many were replaced."""
    if not any(n.op == "call_function" and n.target == torch.ops.npu.npu_add_rms_norm.default
               for n in gm.graph.nodes):
        return 0                       # nothing to fuse: do not pay for building the patterns
    fxgraph.stream_labels(gm)
    count = _patterns().apply(gm.graph)
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
