"""pyACL (``acl``) is importable under emulation, as on a machine with CANN: vLLM-Ascend's sleep-mode
allocator imports ``acl.rt.memcpy`` at module level (29 of its tests/ut tests failed at import)."""
import ctypes

import pytest
import torch

import pytest_npugraph


@pytest.mark.npu_devices(2)
def test_device_queries_answer_from_the_emulated_runtime(npugraph):
    import acl

    assert acl.init() == 0
    assert acl.rt.get_device_count() == (2, 0)
    assert acl.rt.set_device(1) == 0
    assert acl.rt.get_device() == (1, 0)
    assert torch.ones(1, device="npu").device == torch.device("npu:1")
    assert acl.rt.set_device(2) == acl.ACL_ERROR_INVALID_PARAM
    free, total, ret = acl.rt.get_mem_info(0)
    assert ret == 0 and 0 < free <= total
    assert acl.finalize() == 0


def test_host_to_host_memcpy_copies_and_device_addresses_are_not_emulated():
    from acl.rt import ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_HOST, memcpy

    src = (ctypes.c_char * 4)(*b"abcd")
    dst = ctypes.create_string_buffer(4)
    assert memcpy(ctypes.addressof(dst), 4, ctypes.addressof(src), 4, ACL_MEMCPY_HOST_TO_HOST) == 0
    assert dst.raw == b"abcd"
    assert memcpy(ctypes.addressof(dst), 2, ctypes.addressof(src), 4, ACL_MEMCPY_HOST_TO_HOST) == 100000
    t = torch.ones(4, device="npu")
    with pytest.raises(pytest_npugraph.NotEmulated, match="raw device addresses are not emulated"):
        memcpy(ctypes.addressof(dst), 4, t.data_ptr(), 4, ACL_MEMCPY_DEVICE_TO_HOST)
