"""``torchair.ops.record()`` / ``wait(tensors)``: explicit cross-stream ordering inside graphs
(``air::record`` returns an empty tensor standing for "this point on this stream")."""
from typing import List

import torch
from torch.fx.node import has_side_effect

from ._lib import lib

def define_record_wait(lib, namespace: str) -> None:
    """``<namespace>::record`` / ``<namespace>::wait`` (torchair: ``air``; npugraph_ex: its own)."""
    ops = getattr(torch.ops, namespace)
    if not hasattr(ops, "record"):
        lib.define("record(*, Device? device=None) -> Tensor")
        torch.library.impl(lib, "record", "BackendSelect")(lambda *, device=None: torch.empty(0, device=device))
        torch.library.impl(lib, "record", "Meta")(lambda *, device=None: torch.empty(0, device="meta"))
    if not hasattr(ops, "wait"):
        lib.define("wait(Tensor[] x) -> ()")
        has_side_effect(ops.wait.default)
        torch.library.impl(lib, "wait", "BackendSelect")(lambda tensors: None)
        torch.library.impl(lib, "wait", "Meta")(lambda tensors: None)


define_record_wait(lib, "air")


def _wait(tensors: List[torch.Tensor]):
    if tensors is not None and not hasattr(tensors, "__len__"):
        raise TypeError(f"object of type '{type(tensors).__name__}' has no len()")   # as torchair's len() check
    if tensors is None or len(tensors) == 0:
        raise ValueError("torchair.ops.wait() requires at least one tensor input")
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError("arguments of torchair.ops.wait() must be torch.Tensor")
    return torch.ops.air.wait(tensors)


def _record():
    return torch.ops.air.record()
