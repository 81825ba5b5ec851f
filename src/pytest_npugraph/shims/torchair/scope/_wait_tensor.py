"""``air::wait_tensor``: only the GE compiler gives it meaning (a control edge); anywhere it actually
runs (eager code, reduce-overhead graphs) its kernel raises."""
import torch

from ._lib import lib

if not hasattr(torch.ops.air, "wait_tensor"):
    lib.define("wait_tensor(Tensor self, Tensor dependency) -> Tensor")

    @torch.library.impl(lib, "wait_tensor", "Meta")
    def _kernel_meta(self: torch.Tensor, dependency: torch.Tensor):
        # returning ``self`` makes later uses of ``self`` in a traced graph consume this node,
        # so a discarded result still orders them (what torchair relies on)
        return self

    def _kernel_impl(self: torch.Tensor, dependency: torch.Tensor):
        raise NotImplementedError(
            "torch.ops.air.wait_tensor kernel_impl is not implemented! npu_wait_tensor is not support in this mode.")

    torch.library.impl(lib, "wait_tensor", "CPU")(_kernel_impl)
    torch.library.impl(lib, "wait_tensor", "PrivateUse1")(_kernel_impl)


def _npu_wait_tensor(self: torch.Tensor, dependency: torch.Tensor):
    return torch.ops.air.wait_tensor(self, dependency)
