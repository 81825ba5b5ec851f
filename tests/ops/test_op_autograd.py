"""Ops that torch_npu makes differentiable stay differentiable on the emulated device."""
import torch
import torch_npu


def test_npu_format_cast_passes_the_gradient_through(npugraph):
    # torch_npu's npu_format_cast has a backward (the values are unchanged; the gradient passes through),
    # also on the same-format (no-op) path
    a = torch.rand(4, 8).npu().requires_grad_(True)
    weights = torch.arange(8.0)
    nz = torch_npu.npu_format_cast(a, 29)
    same = torch_npu.npu_format_cast(a, torch_npu.get_npu_format(a))
    ((nz + same) * weights.npu()).sum().backward()
    assert torch_npu.get_npu_format(nz) == 29
    assert torch.equal(a.grad.cpu(), 2 * weights.expand(4, 8))
