"""uint16/uint32/uint64 NPU tensors (runtime/wide_uints.py): the ops whose Atlas A2/A3 kernels take them
compute (also where CPU torch's kernel would refuse); every other op raises torch_npu's RuntimeError,
including ops CPU torch would compute (``mul``, ``cat``, ``sum``, ``randint``)."""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T

WIDE = [torch.uint16, torch.uint32, torch.uint64]


@pytest.mark.parametrize("dtype", WIDE)
def test_copies_casts_fills_and_selects_compute(dtype, npugraph):
    a = torch.tensor([1, 2, 3, 4], dtype=dtype).npu()
    big = torch.tensor([torch.iinfo(dtype).max], dtype=dtype).npu()
    assert big.cpu().item() == torch.iinfo(dtype).max               # host <-> device keeps every bit
    assert a.float().cpu().tolist() == [1.0, 2.0, 3.0, 4.0]          # aclnnCast
    assert torch.tensor([7, 8], device="npu").to(dtype).cpu().tolist() == [7, 8]
    assert a.view(2, 2).t().contiguous().cpu().tolist() == [[1, 3], [2, 4]]   # aclnnInplaceCopy
    assert a.clone().fill_(9).cpu().tolist() == [9, 9, 9, 9]
    assert torch.full((2,), 5, dtype=dtype, device="npu").cpu().tolist() == [5, 5]
    pick = torch.tensor([True, False, True, False], device="npu")
    assert torch.where(pick, a, a.clone().fill_(0)).cpu().tolist() == [1, 0, 3, 0]
    assert torch.stack([a, a]).cpu().tolist() == [[1, 2, 3, 4]] * 2
    assert a.repeat(2).cpu().tolist() == [1, 2, 3, 4] * 2
    assert torch.nn.functional.pad(a, (1, 1)).cpu().tolist() == [0, 1, 2, 3, 4, 0]
    assert torch.equal(a, a.clone())
    assert a[2].item() == 3
    assert any(isinstance(r, T.Kernel) and r.op.startswith("aten::where") for r in npugraph.trace.records)
    npugraph.assert_clean()


@pytest.mark.parametrize("dtype", WIDE)
def test_add_raises_torch_npus_aclnn_error(dtype):
    a = torch.tensor([1, 2], dtype=dtype).npu()
    acl = {torch.uint16: "DT_UINT16", torch.uint32: "DT_UINT32", torch.uint64: "DT_UINT64"}[dtype]
    with pytest.raises(RuntimeError, match=r"call aclnnAdds failed, error code is 161002[\s\S]*EZ1001\): Tensor self "
                                           rf"not implemented for {acl}, should be in dtype support list \[DT_FLOAT,"):
        a + 1
    with pytest.raises(RuntimeError, match=r"call aclnnAdd failed, error code is 161002"):
        a + a


@pytest.mark.parametrize("dtype", WIDE)
@pytest.mark.parametrize("op", [
    lambda a: a * 2,                  # CPU torch computes these four: the NPU refuses them
    lambda a: torch.cat([a, a]),
    lambda a: a.sum(),
    lambda a: a == a,
    lambda a: a - a,
], ids=["mul", "cat", "sum", "eq", "sub"])
def test_ops_without_a_wide_uint_kernel_raise_runtime_error(dtype, op):
    a = torch.tensor([1, 2], dtype=dtype).npu()
    with pytest.raises(RuntimeError, match=r"NPU function error: call aclnn.* failed, error code is 161002"):
        op(a)


def test_random_ops_refuse_the_dtype_as_torch_npu():
    with pytest.raises(RuntimeError, match=r"self scalar_type:UInt64is not surpported\."):
        torch.randint(0, 100, (1,), dtype=torch.uint64, device="npu")


def test_zeros_and_bitwise_and_take_uint16_only():
    assert torch.zeros(2, dtype=torch.uint16, device="npu").cpu().tolist() == [0, 0]
    a = torch.tensor([6, 3], dtype=torch.uint16).npu()
    assert (a & a.clone().fill_(2)).cpu().tolist() == [2, 2]
    with pytest.raises(RuntimeError, match="Tensor self not implemented for DT_UINT32"):
        torch.zeros(2, dtype=torch.uint32, device="npu")
    b = torch.tensor([6, 3], dtype=torch.uint64).npu()
    with pytest.raises(RuntimeError, match="Tensor self not implemented for DT_UINT64"):
        b & b


def test_other_dtypes_are_untouched(npugraph):
    for dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
        a = torch.tensor([1, 2], dtype=dtype).npu()
        assert (a + a * 2).sum().item() == 9
    npugraph.assert_clean()


def test_a_wide_uint_in_a_compiled_graph_raises_as_eagerly():
    fn = torch.compile(lambda a: a * 2, backend="aot_eager")
    with pytest.raises(Exception, match="Tensor self not implemented for DT_UINT32"):
        fn(torch.tensor([1, 2], dtype=torch.uint32).npu())
