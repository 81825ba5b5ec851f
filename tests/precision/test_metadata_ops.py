"""In-place ops that change only sizes, strides or offset run no kernel: they are not writes."""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T

METADATA_OPS = {
    "unsqueeze_": lambda a: a.unsqueeze_(0),
    "squeeze_": lambda a: a.unsqueeze_(0).squeeze_(0),
    "t_": lambda a: a.t_(),
    "transpose_": lambda a: a.transpose_(0, 1),
    "swapdims_": lambda a: a.swapdims_(0, 1),
    "as_strided_": lambda a: a.as_strided_((8, 4), (1, 8)),
    "resize_ (fits)": lambda a: a.resize_(8, 4),
    "detach_": lambda a: a.detach_(),
}


def kernels(npugraph, start=0):
    return [r.op for r in npugraph.trace.records[start:] if isinstance(r, T.Kernel)]


@pytest.mark.parametrize("name", METADATA_OPS)
def test_metadata_op_on_a_side_stream_does_not_race(npugraph, name):
    a = torch.randn(4, 8, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    start = len(npugraph.trace)
    with torch.npu.stream(side):
        METADATA_OPS[name](a)
    assert kernels(npugraph, start) == []
    total = a.sum()                               # main stream; the side stream ran nothing
    assert npugraph.hazards == []
    torch.testing.assert_close(total.cpu(), a.cpu().sum())


def test_a_real_write_on_the_side_stream_still_races(npugraph):
    a = torch.randn(4, 8, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        a.unsqueeze_(0).mul_(2)
    with npugraph.expect("race", match=r"may still be writing it in aten::mul_"):
        a.sum()


def test_resize_that_grows_the_storage_is_device_work(npugraph):
    a = torch.randn(4, 8, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        a.resize_(64, 64)
    assert kernels(npugraph)[-1] == "aten::resize_"
    with npugraph.expect("race", match=r"writing it in aten::resize_"):
        a.sum()


def test_metadata_ops_keep_values_and_shapes(npugraph):
    a = torch.arange(32.0, device="npu").view(4, 8)
    a.t_()
    assert a.shape == (8, 4) and a.stride() == (1, 8)
    a.unsqueeze_(1)
    assert a.shape == (8, 1, 4)
    torch.testing.assert_close(a.cpu(), torch.arange(32.0).view(4, 8).t().unsqueeze(1))
    npugraph.assert_clean()
