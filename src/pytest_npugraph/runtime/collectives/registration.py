"""The torch library side of the collectives: the multi-rank kernels of the MC2 ops (once per process)."""
from __future__ import annotations

import torch

from ..tensor import NpuTensor
from .c10d_math import MATH

# ------------------------------------------------------------------------ MC2 kernels
_mc2_library = None


def install() -> None:
    """Route the multi-rank MC2 ops on NPU tensors to the job (once per process): every op whose spec
    has a multi-rank kernel (``OpSpec.mc2``) gets it on ``AutogradPrivateUse1``, above the NPU
    tensors' Python dispatch, and its collective math (``OpSpec.mc2_math``) joins ``MATH``."""
    global _mc2_library
    if _mc2_library is not None:
        return
    from ..ops import library

    _mc2_library = torch.library.Library("npu", "IMPL")
    for spec in list(library.SPECS.values()):
        if spec.mc2 is not None:
            _mc2_library.impl(spec.name, _mc2_kernel(spec), "AutogradPrivateUse1")
        if spec.mc2_math is not None:
            MATH[spec.name] = spec.mc2_math


def _mc2_kernel(spec):
    """The AutogradPrivateUse1 kernel of an op with a multi-rank kernel (``OpSpec.mc2``):
    ``spec.mc2(name, arguments)`` on real NPU tensors; on fake tensors (tracing), or when it returns
    None (a world of one rank, no ``run_ranks``), the ordinary single-device path (the op's math)."""
    import inspect

    signature = inspect.signature(spec.impl)
    base, _, overload = spec.name.partition(".")
    target = getattr(torch.ops.npu, base).__getattr__(overload or "default")

    def kernel(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        tensors = [v for v in a.values() if isinstance(v, torch.Tensor)]
        real = all(isinstance(t, NpuTensor) and t._payload.device.type == "cpu" and
                   type(t._payload) is torch.Tensor for t in tensors)
        result = spec.mc2(spec.name, a) if real else None
        if result is None:
            with torch._C._AutoDispatchBelowAutograd():
                return target(*args, **kwargs)
        return result
    kernel.__name__ = f"{base}_multi_rank"
    return kernel
