"""CPU kernel gaps: an op the NPU runs for a dtype whose CPU kernel is missing.

The emulator computes every op with torch's CPU kernels, and a few of those lack dtypes the Ascend
kernels take: ``histc`` of integers (transformers' MoE routing calls it on any device but cpu/mps),
and half/bfloat16 kernels (``cdist``, ``histogram``...).  Model code would then fail here on a path it
takes without trouble on hardware.  When the CPU kernel raises torch's ``"<kernel>" not implemented
for '<Dtype>'`` for such a dtype, the op is computed again with those tensors widened (float32 for
half/bfloat16, float64 for integers, exact for them) and every result is returned in the dtype the NPU
gives, read off the op's meta kernel; in-place and ``out=`` arguments get the values written back.

Half and bfloat16 are widened for any op: the Ascend kernels are half-native.  Integers only for
the ops in ``INTEGER_OPS``, whose NPU kernel takes integer input; for any other op an integer gap is
also the NPU's error (``softmax`` of an int tensor fails there too), so the error stands.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_map

_MISSING = re.compile(r"not implemented for '(\w+)'")
_LOW_PRECISION = {"Half": torch.float16, "BFloat16": torch.bfloat16}
_INTEGER = {"Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16, "Int": torch.int32, "Long": torch.int64}

# aten ops whose NPU kernel (aclnn) takes integer input where the CPU kernel does not
INTEGER_OPS = frozenset({"aten::histc"})

_result_dtypes: dict = {}


def gap_dtype(func, error: BaseException) -> Optional[torch.dtype]:
    """The dtype ``error`` says the CPU kernel of ``func`` lacks, if the NPU has that kernel."""
    if not isinstance(error, RuntimeError) or not isinstance(func, torch._ops.OpOverload):
        return None
    found = _MISSING.search(str(error))
    if found is None:
        return None
    name = found.group(1)
    if name in _LOW_PRECISION:
        return _LOW_PRECISION[name]
    if name in _INTEGER and func._schema.name in INTEGER_OPS:
        return _INTEGER[name]
    return None


def widened(func, dtype: torch.dtype) -> Callable:
    """``func`` computed with its ``dtype`` tensors widened; same arguments, results as the NPU's."""
    wide = torch.float32 if dtype.is_floating_point else torch.float64
    written = [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    names = [a.name for a in func._schema.arguments]

    def run(*args, **kwargs):
        def up(x):
            return x.to(wide) if isinstance(x, torch.Tensor) and x.dtype == dtype else x
        wargs, wkwargs = tree_map(up, args), tree_map(up, kwargs)
        out = func(*wargs, **wkwargs)
        back = {}
        for i in written:       # in-place / out=: the widened copy was written; write the original
            original = args[i] if i < len(args) else kwargs.get(names[i])
            copy = wargs[i] if i < len(wargs) else wkwargs.get(names[i])
            if isinstance(original, torch.Tensor) and copy is not original:
                original.copy_(copy)
                back[id(copy)] = original
        return _narrow(out, back, _dtypes(func, args, kwargs), dtype, wide)
    run.__name__ = f"{func.__name__}[{dtype} widened]"
    return run


def _narrow(out, back, expected, dtype, wide):
    flat, spec = tree_flatten(out)
    fixed = []
    for k, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            if id(x) in back:
                x = back[id(x)]
            else:
                want = expected[k] if expected is not None and k < len(expected) else (dtype if x.dtype == wide else None)
                if want is not None and x.dtype != want:
                    x = x.to(want)
        fixed.append(x)
    return spec.unflatten(fixed)


def _dtypes(func, args, kwargs):
    """The result dtypes the op has for these argument dtypes (its meta kernel), or None."""
    leaves = tree_flatten((args, kwargs))[0]
    key = (func, tuple((x.dtype, x.dim()) if isinstance(x, torch.Tensor) else type(x) for x in leaves))
    if key in _result_dtypes:
        return _result_dtypes[key]

    def meta(x):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x
    try:
        out = func(*tree_map(meta, args), **tree_map(meta, kwargs))
        found = [x.dtype if isinstance(x, torch.Tensor) else None for x in tree_flatten(out)[0]]
    except Exception:  # noqa: BLE001 (no meta kernel, or a data-dependent shape: narrow by rule)
        found = None
    _result_dtypes[key] = found
    return found
