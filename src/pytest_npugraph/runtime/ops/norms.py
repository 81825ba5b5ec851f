"""Norms and activations: npu_swiglu, npu_rms_norm, npu_add_rms_norm (and v2, in place)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .spec import OpSpec, vector


# ----------------------------------------------------------------------------- elementwise / norms
def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``A * sigmoid(A) * B`` with A, B the first and second halves of ``self`` along ``dim``."""
    half = self.size(dim) // 2
    a = self.narrow(dim, 0, half).to(torch.float32)
    b = self.narrow(dim, half, half).to(torch.float32)
    return (F.silu(a) * b).to(self.dtype)


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """RMS norm over the trailing ``gamma.dim()`` dims; returns (y, rstd) with rstd float32."""
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    x = self.to(torch.float32)
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (x * rstd * gamma.to(torch.float32)).to(self.dtype), rstd


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """Residual add fused with RMS norm; returns (rms_norm(x1+x2)*gamma, rstd, x1+x2)."""
    total = x1.to(torch.float32) + x2.to(torch.float32)
    y, rstd = npu_rms_norm(total, gamma, epsilon)
    return y.to(x1.dtype), rstd, total.to(x1.dtype)


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


SPECS = [
    OpSpec("npu_swiglu(Tensor self, int dim=-1) -> Tensor", npu_swiglu, vector()),
    OpSpec("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
           npu_rms_norm, vector()),
    OpSpec("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
           npu_add_rms_norm, vector()),
    # In place: x1 <- rms_norm(x1+x2)*gamma, x2 <- x1+x2.  Functionalization rewrites it to the
    # _functional variant (library._add_functionalization), as torch_npu's codegen does.
    OpSpec("npu_add_rms_norm_v2(Tensor(a!) x1, Tensor(b!) x2, Tensor gamma, float epsilon=1e-06) -> Tensor",
           npu_add_rms_norm_v2, vector()),
    OpSpec("npu_add_rms_norm_v2_functional(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
           "-> (Tensor, Tensor, Tensor)", npu_add_rms_norm_v2_functional, vector()),
]
