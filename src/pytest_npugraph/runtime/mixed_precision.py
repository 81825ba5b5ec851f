"""Matrix products with mixed floating dtypes, as aclnn computes them.

CPU torch refuses ``mm``/``addmm``/``bmm``/``baddbmm`` whose operands differ in dtype ("mat1 and mat2
must have the same dtype"); torch_npu's kernels (aclnnMm, aclnnMatmul, aclnnAddmm, aclnnBatchMatMul)
accept them: their documentation (CANN aolapi, e.g. aclnnMatmul / aclnnMm, parameters self and mat2)
requires only that the operand dtypes satisfy the type-promotion table (互推导关系: float16 x float32
-> float32), and the output has the promoted dtype.  So an fp16 activation into an fp32
``nn.Linear`` runs on the NPU and gives fp32.  The emulator casts the operands to the promoted dtype
first (aclnn's own Cast tasks, which appear in the trace) and runs the op there.

Fake tensors (graph tracing) are left to torch's meta functions."""
from __future__ import annotations

import functools

import torch

OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::mv", "aten::addmv")


def _promoted(args):
    dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
    if len(dtypes) < 2 or not all(d.is_floating_point for d in dtypes):
        return None
    return functools.reduce(torch.promote_types, dtypes)


def promoted_product(func, plan, args, kwargs):
    from .tensor import _is_fake, _run

    target = _promoted(args)
    if target is not None and not any(_is_fake(getattr(a, "_payload", a)) for a in args
                                      if isinstance(a, torch.Tensor)):
        args = tuple(a.to(target) if isinstance(a, torch.Tensor) and a.dtype != target else a for a in args)
    return _run(func, plan, args, kwargs)


def install() -> None:
    from . import tensor

    for name in OPS:
        if name not in tensor._HANDLERS:
            tensor.register_op_handler(name, promoted_product)
