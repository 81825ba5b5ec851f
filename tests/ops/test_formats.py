"""Storage formats as torch_npu computes them (issue 23 item 4): same-format casts return their input,
NZ and other padded formats get torch_npu's storage sizes, and the factory family dispatches on
``device`` (it has no tensor argument)."""
import pytest
import torch
import torch_npu

from pytest_npugraph import trace as T
from pytest_npugraph.runtime.ops import layout


def independent_nz_bytes(m, n, itemsize):
    """FRACTAL_NZ: (..., m, n) is stored as (n / C0, m / 16, 16, C0) blocks, C0 = 32 bytes / min(itemsize, 2)."""
    c0 = 32 // min(itemsize, 2)
    return -(-n // c0) * -(-m // 16) * 16 * c0 * itemsize


def test_nz_storage_of_a_15_by_17_fp16_tensor_is_1024_bytes():
    x = torch.randn(15, 17, device="npu").half()
    nz = torch_npu.npu_format_cast(x, 29)
    assert nz.untyped_storage().nbytes() == 1024 == independent_nz_bytes(15, 17, 2)
    assert torch_npu.get_npu_format(nz) == torch_npu.Format.FRACTAL_NZ
    assert nz.shape == x.shape and torch.equal(nz.cpu(), x.cpu())   # values in logical order


@pytest.mark.parametrize("shape,dtype", [((15, 17), torch.float32), ((3, 40, 33), torch.bfloat16),
                                         ((16, 64), torch.int8), ((5,), torch.float16), ((1, 1), torch.float16)])
def test_nz_storage_sizes_follow_torch_npu(shape, dtype):
    x = torch.zeros(shape, dtype=dtype, device="npu")
    nz = torch_npu.npu_format_cast(x, 29)
    dims = list(shape) if len(shape) >= 2 else [1] + list(shape)
    batch = 1
    for d in dims[:-2]:
        batch *= d
    assert nz.untyped_storage().nbytes() == batch * independent_nz_bytes(dims[-2], dims[-1], x.element_size())


def test_nz_allocation_takes_the_padded_bytes_from_the_device(npugraph):
    x = torch.zeros(15, 17, dtype=torch.float16, device="npu")
    before = torch.npu.memory_allocated()
    nz = torch_npu.npu_format_cast(x, 29)
    assert torch.npu.memory_allocated() - before >= 1024
    del nz


def test_other_padded_formats():
    assert layout.storage_nbytes([2, 3, 4, 5], torch.float16, 3) == 2 * 1 * 4 * 5 * 16 * 2      # NC1HWC0
    assert layout.storage_nbytes([17, 3, 2, 2], torch.float16, 4) == (1 * 2 * 2) * 2 * 16 * 16 * 2   # FRACTAL_Z
    assert layout.storage_nbytes([15, 17], torch.float16, 2) == 510                            # ND: no padding
    assert layout.storage_nbytes([2, 3, 4, 5], torch.float32, 0) == 480                        # NCHW
    with pytest.raises(RuntimeError, match="cannot convert to NDC1HWC0"):
        layout.storage_nbytes([2, 3], torch.float16, 32)


def test_same_format_cast_returns_the_input_itself_with_no_task(npugraph):
    x = torch.randn(4, 8, device="npu")
    kernels = len([r for r in npugraph.trace.records if isinstance(r, T.Kernel)])
    assert torch_npu.npu_format_cast(x, 2) is x                      # ND to ND
    assert torch.ops.npu.npu_format_cast(x, torch_npu.Format.ND) is x
    nz = torch_npu.npu_format_cast(x, 29)
    assert nz is not x
    assert torch_npu.npu_format_cast(nz, 29) is nz                   # NZ to NZ
    assert torch.ops.npu.npu_format_cast.Tensor(nz, x) is not nz    # .Tensor overload: to x's ND
    assert torch.ops.npu.npu_format_cast.Tensor(x, x) is x
    new = [r.op for r in npugraph.trace.records if isinstance(r, T.Kernel)][kernels:]
    assert new == ["npu::npu_format_cast", "npu::npu_format_cast.Tensor"]   # only the two real casts ran


def test_cast_of_a_tensor_that_requires_grad_stays_differentiable():
    x = torch.randn(3, 3, device="npu", requires_grad=True)
    y = torch_npu.npu_format_cast(x, 2)
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.ones(3, 3))


def test_empty_with_format_on_npu():
    e = torch_npu.empty_with_format((15, 17), dtype=torch.float16, device="npu", acl_format=29)
    assert e.device == torch.device("npu", 0) and e.shape == (15, 17) and e.dtype == torch.float16
    assert torch_npu.get_npu_format(e) == 29 and e.untyped_storage().nbytes() == 1024
    nd = torch.ops.npu.empty_with_format([4, 4], dtype=torch.float32, device="npu:0")
    assert torch_npu.get_npu_format(nd) == 2 and nd.untyped_storage().nbytes() == 64
    u = torch_npu.unsafe_empty_with_format([2, 3], dtype=torch.float16, device="npu", acl_format=29)
    assert u.untyped_storage().nbytes() == 1 * 1 * 16 * 16 * 2
    s = torch_npu.empty_with_swapped_memory([3], dtype=torch.float32, device="npu")
    assert s.device.type == "npu" and s.shape == (3,)


@pytest.mark.npu_devices(2)
def test_empty_with_format_follows_the_device_argument_and_the_current_device():
    assert torch_npu.empty_with_format((2,), device="npu:1").device == torch.device("npu", 1)
    torch.npu.set_device(1)
    assert torch_npu.empty_with_format((2,), device="npu").device == torch.device("npu", 1)


def test_empty_with_format_without_an_npu_device_fails_like_torch_npu():
    with pytest.raises(NotImplementedError, match="Could not run 'npu::empty_with_format' with arguments from the 'CPU'"):
        torch_npu.empty_with_format((2,), dtype=torch.float16)


def test_empty_with_format_out_of_memory_is_the_npus():
    with pytest.raises(torch.OutOfMemoryError):
        torch_npu.empty_with_format((1 << 40,), dtype=torch.float16, device="npu")


def test_factory_without_math_still_dispatches_and_names_itself():
    with pytest.raises(NotImplementedError, match="npu_dropout_gen_mask"):
        torch_npu.npu_dropout_gen_mask([4], 0.5, device="npu")
