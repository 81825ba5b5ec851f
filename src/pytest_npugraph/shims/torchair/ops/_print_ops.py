"""``torchair.ops.npu_print``: ``air::print``, an op with side effects that prints its tensors when the
graph (or the eager op) runs, in TorchAir's format: integral values without a point, others with 9
significant digits; at most ``summarize_size`` leading and trailing entries per dimension ("..." between),
-1 for all; rows on their own lines; ``tensor_detail`` adds shape and dtype.  GE mode prints when the
graph runs too (the real one through StringFormat/PrintV2 on the device).  In a captured graph
(reduce-overhead, npugraph_ex) it prints at every replay with that replay's values and not at the
capture (TorchAir warns npu_print "may not take effect" there: its host kernel would read the capture's
empty buffers)."""
from __future__ import annotations

from typing import List

import torch
from torch.fx.node import has_side_effect

from ._lib import lib


def _number(v) -> str:
    v = float(v)
    return f"{v:.0f}" if v.is_integer() else f"{v:.9g}"


def _summarize(values, ndim: int, nums: int) -> str:
    if ndim == 0:
        return _number(values)
    n = len(values)
    cut = 0 <= nums and 2 * nums < n
    if ndim == 1:
        parts = [_number(v) for v in values[:nums]] + ["..."] + [_number(v) for v in values[n - nums:]] if cut \
            else [_number(v) for v in values]
        return f"[{' '.join(parts)}]"
    if cut:
        parts = [_summarize(v, ndim - 1, nums) for v in values[:nums]] + ["..."] + \
                [_summarize(v, ndim - 1, nums) for v in values[n - nums:]]
    else:
        parts = [_summarize(v, ndim - 1, nums) for v in values]
    return "[" + "\n ".join(parts) + "]"


def summarize_tensor(tensor: torch.Tensor, summarize_size: int) -> str:
    if summarize_size < -1 or summarize_size == 0:
        raise ValueError(f"summarize_size must be positive or -1 for all elements, got {summarize_size}")
    tensor = getattr(tensor, "_payload", tensor).detach()    # an NPU tensor's values (the kernel runs on the host)
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return _summarize(tensor.tolist(), tensor.dim(), summarize_size)


def _capturing() -> bool:
    """Inside a graph capture the op is a replay step (the runtime's ``air::print`` handler): the capture
    prints nothing, each replay prints its values."""
    from pytest_npugraph.runtime.runtime import current

    return current().current_stream().capture is not None


def kernel_impl(tensors: List[torch.Tensor], msg_format: str, placeholder: str, summarize_size: int,
                tensor_detail: bool):
    if _capturing():
        return
    for t in tensors:
        msg_format = msg_format.replace(placeholder, summarize_tensor(t, summarize_size), 1)
        if tensor_detail:
            msg_format = msg_format.replace(placeholder, str(list(t.shape)), 1)
    print(msg_format, flush=True)


if not hasattr(torch.ops.air, "print"):
    lib.define("print(Tensor[] tensors, str msg_format, str placeholder, int summarize_size, bool tensor_detail) "
               "-> None")
    has_side_effect(torch.ops.air.print.default)
    torch.library.impl(lib, "print", "Meta")(lambda *args: None)
    torch.library.impl(lib, "print", "CPU")(kernel_impl)
    torch.library.impl(lib, "print", "PrivateUse1")(kernel_impl)


def _npu_print(*args, summarize_size, tensor_detail):
    for i, arg in enumerate(args):
        if not isinstance(arg, (torch.Tensor, str, bool, float, int)):
            raise TypeError(f"position arguments of npu_print() must be torch.Tensor or basic type in (str, bool, "
                            f"float, int), but got '{type(arg).__name__}' at position {i}")
    tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
    if not tensors:
        raise ValueError("npu_print() requires at least one tensor input")
    if not isinstance(summarize_size, int):
        raise TypeError(f"summarize_size must be int, got {type(summarize_size).__name__}")
    if summarize_size < -1 or summarize_size == 0:
        raise ValueError(f"summarize_size must be positive or -1 for all elements, got {summarize_size}")
    if not isinstance(tensor_detail, bool):
        raise TypeError(f"tensor_detail must be bool, got {type(tensor_detail).__name__}")
    # a placeholder that none of the texts contains
    texts = " ".join("" if isinstance(arg, torch.Tensor) else str(arg) for arg in args)
    placeholder, i = "{}", 0
    while placeholder in texts:
        placeholder, i = f"{{{i}}}", i + 1
    if tensor_detail:
        parts = [f"tensor({placeholder}, shape={placeholder}, dtype={arg.dtype})" if isinstance(arg, torch.Tensor)
                 else str(arg) for arg in args]
    else:
        parts = [placeholder if isinstance(arg, torch.Tensor) else str(arg) for arg in args]
    torch.ops.air.print(tensors, " ".join(parts), placeholder, summarize_size, tensor_detail)
