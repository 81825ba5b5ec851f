"""``npugraph_ex::record`` / ``npugraph_ex::wait`` (for custom passes; TorchAir's ``air`` twins)."""
import torch
from torch.fx.node import has_side_effect

from ._lib import lib

if not hasattr(torch.ops.npugraph_ex, "record"):
    lib.define("record(*, Device? device=None) -> Tensor")
    torch.library.impl(lib, "record", "BackendSelect")(lambda *, device=None: torch.empty(0, device=device))
    torch.library.impl(lib, "record", "Meta")(lambda *, device=None: torch.empty(0, device="meta"))

if not hasattr(torch.ops.npugraph_ex, "wait"):
    lib.define("wait(Tensor[] x) -> ()")
    has_side_effect(torch.ops.npugraph_ex.wait.default)
    torch.library.impl(lib, "wait", "BackendSelect")(lambda tensors: None)
    torch.library.impl(lib, "wait", "Meta")(lambda tensors: None)
