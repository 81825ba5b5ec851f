"""Seed 004: ``SetNextTaskStart`` inside a SuperKernel lets the next sub-kernel start early.

Sub-kernels of a SuperKernel (``torchair.scope.super_kernel`` in GE mode) run in order with a sync
between each two; a sub-kernel calling ``SetNextTaskStart`` (here ``npu_early_start_add``, the seed's
``early_start_kernel``, registered in conftest.py with ``set_next_task_start``) lets the next one start
before it has finished.  If that next sub-kernel consumes its output, it can read a partly written
tensor.  Fix: let an independent sub-kernel be the one that starts early (or move the consumer out of
the scope, or call ``SetNextTaskStart`` only after the last data move the consumer depends on).
"""
import torch
import torch_npu
import torchair
from torchair import scope
from torchair.configs.compiler_config import CompilerConfig

HIDDEN = 16


def compiled(fn):
    return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=CompilerConfig()),
                         fullgraph=True, dynamic=False)


def buggy_layer(hidden, residual, weight):
    with scope.super_kernel("decode_layer"):
        summed = torch.ops.npu.npu_early_start_add(hidden, residual)   # calls SetNextTaskStart
        normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6)  # starts early, reads summed
        gate = torch.sigmoid(weight)
        return normed * gate


def fixed_layer(hidden, residual, weight):
    with scope.super_kernel("decode_layer"):
        summed = torch.ops.npu.npu_early_start_add(hidden, residual)   # calls SetNextTaskStart
        gate = torch.sigmoid(weight)                                   # independent: it starts early
        normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6)
        return normed * gate


def inputs():
    g = torch.Generator().manual_seed(4)
    return [torch.randn(2, HIDDEN, generator=g) for _ in range(3)]


def reference(hidden, residual, weight):
    summed = hidden + residual
    return summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.sigmoid(weight)


def test_next_sub_kernel_reads_the_early_started_output(npugraph):
    cpu = inputs()
    with npugraph.expect("super-kernel", match="npu_early_start_add.*SetNextTaskStart"):
        out = compiled(buggy_layer)(*(t.npu() for t in cpu))
    torch.testing.assert_close(out.cpu(), reference(*cpu))   # the CPU numbers hide it: the device may not


def test_an_independent_sub_kernel_starts_early_instead(npugraph):
    cpu = inputs()
    out = compiled(fixed_layer)(*(t.npu() for t in cpu))
    torch.testing.assert_close(out.cpu(), reference(*cpu))
    npugraph.assert_clean()
