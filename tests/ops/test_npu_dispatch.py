"""Custom ops on NPU tensors: dispatched through the emulated device, recorded with their profile."""
import pytest
import torch

import torch_npu

from pytest_npugraph.trace import Kernel


def kernels(npugraph, name):
    return [r for r in npugraph.trace.records if isinstance(r, Kernel) and name in r.op]


def test_custom_op_on_npu_tensors_runs_reference_math_and_records_its_profile(npugraph):
    x = torch.randn(4, 8)
    y = torch_npu.npu_swiglu(x.npu(), dim=-1)
    assert y.device.type == "npu"
    a, b = x.chunk(2, dim=-1)
    torch.testing.assert_close(y.cpu(), torch.nn.functional.silu(a) * b)
    (k,) = kernels(npugraph, "npu_swiglu")
    assert k.cores.kind == "AIV" and k.cores.vector == npugraph.vector_cores
    assert k.reads and k.writes and k.site.path.endswith("test_npu_dispatch.py")


def test_custom_op_is_reachable_as_torch_ops_npu(npugraph):
    x = torch.randn(2, 4, 16).npu()
    gamma = torch.ones(16).npu()
    y, rstd = torch.ops.npu.npu_rms_norm(x, gamma, 1e-6)
    assert y.device.type == rstd.device.type == "npu"
    ref = x.cpu() * torch.rsqrt(x.cpu().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.npu_cores(aicore=4, vector=8)
def test_matmul_like_ops_take_cube_cores_and_nonzero_is_all_resident(npugraph):
    a = torch.randn(8, 8).npu()
    (a @ a).nonzero()
    mm = kernels(npugraph, "aten::mm")[0]
    nz = kernels(npugraph, "aten::nonzero")[0]
    assert (mm.cores.kind, mm.cores.cube) == ("AICore", 4)
    assert nz.cores.all_resident and nz.cores.vector == 8


def test_stream_limit_is_recorded_on_kernels(npugraph):
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, 6, 12)
    with torch.npu.stream(s):
        torch.ones(4, device="npu").neg()
    k = kernels(npugraph, "aten::neg")[0]
    assert (k.cube_limit, k.vector_limit) == (6, 12)


def test_custom_op_inside_torch_compile(npugraph):
    def f(x):
        return torch_npu.npu_swiglu(x) * 2

    x = torch.randn(4, 8).npu()
    out = torch.compile(f, backend="eager")(x)
    assert out.device.type == "npu"
    torch.testing.assert_close(out.cpu(), f(x).cpu())
