"""Ops the NPU runs for a dtype whose CPU kernel is missing compute widened and answer in the NPU's
dtype (runtime/cpu_gaps.py); gaps the NPU shares keep torch's error."""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T


def _kernels(npugraph, op):
    return [r for r in npugraph.trace.records if isinstance(r, T.Kernel) and r.op.startswith(op)]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_histc_as_transformers_moe_routing_calls_it(dtype, npugraph):
    with pytest.raises(RuntimeError, match="not implemented for"):
        torch.histc(torch.tensor([0, 1], dtype=dtype), bins=2, min=0, max=1)     # the CPU gap
    experts = torch.tensor([[0, 3], [3, 1], [2, 3]], dtype=dtype).npu()
    counts = torch.histc(experts, bins=4, min=0, max=3)
    assert counts.device.type == "npu" and counts.dtype == dtype
    assert counts.cpu().tolist() == [1, 1, 1, 3]
    assert len(_kernels(npugraph, "aten::histc")) == 1
    npugraph.assert_clean()


def test_integer_histc_out_writes_the_callers_tensor(npugraph):
    experts = torch.tensor([1, 1, 0], dtype=torch.int32, device="npu")
    out = torch.full((2,), 7, dtype=torch.int32, device="npu")
    result = torch.histc(experts, bins=2, min=0, max=1, out=out)
    assert result is out and out.cpu().tolist() == [1, 2]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_kernels_missing_on_the_cpu_compute_in_float32(dtype, npugraph):
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(RuntimeError, match="not implemented for"):
        torch.cdist(a.to(dtype), b.to(dtype))
    got = torch.cdist(a.to(dtype).npu(), b.to(dtype).npu())
    expected = torch.cdist(a.to(dtype).float(), b.to(dtype).float()).to(dtype)
    assert got.dtype == dtype and torch.equal(got.cpu(), expected)


def test_a_gap_the_npu_shares_keeps_torchs_error(npugraph):
    with pytest.raises(RuntimeError, match="not implemented for 'Int'"):
        torch.softmax(torch.ones(4, dtype=torch.int32, device="npu"), dim=0)
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        torch.histc(torch.ones(4, dtype=torch.bool, device="npu"), bins=2)


def test_a_captured_gap_op_recomputes_on_replay(npugraph):
    experts = torch.tensor([0, 0, 1], dtype=torch.int32, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        counts = torch.histc(experts, bins=2, min=0, max=1)
    experts.copy_(torch.tensor([1, 1, 1], dtype=torch.int32))
    g.replay()
    assert counts.dtype == torch.int32 and counts.cpu().tolist() == [0, 3]
