"""``acl.rt``: device selection and counts from the emulated runtime; host-to-host ``memcpy``."""
import ctypes

ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
_KINDS = {0: "HOST_TO_HOST", 1: "HOST_TO_DEVICE", 2: "DEVICE_TO_HOST", 3: "DEVICE_TO_DEVICE"}
ACL_SUCCESS = 0                    # return codes (acl re-exports them)
ACL_ERROR_INVALID_PARAM = 100000


def _npu():
    import torch_npu

    return torch_npu.npu


def get_device_count():
    return _npu().device_count(), 0


def _exists(device_id) -> bool:
    return isinstance(device_id, int) and 0 <= device_id < _npu().device_count()


def set_device(device_id: int) -> int:
    if not _exists(device_id):
        return ACL_ERROR_INVALID_PARAM
    _npu().set_device(device_id)
    return ACL_SUCCESS


def reset_device(device_id: int) -> int:
    return ACL_SUCCESS if _exists(device_id) else ACL_ERROR_INVALID_PARAM


def get_device():
    return _npu().current_device(), 0


def get_mem_info(attr: int = 0):
    free, total = _npu().mem_get_info()
    return free, total, 0


def memcpy(dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
    """aclrtMemcpy: ``count`` bytes from ``src`` to ``dst`` (``dest_max`` bytes there); the return code."""
    if kind not in _KINDS or count < 0 or count > dest_max or not dst or not src:
        return ACL_ERROR_INVALID_PARAM
    if kind != ACL_MEMCPY_HOST_TO_HOST:
        from pytest_npugraph.errors import NotEmulated

        raise NotEmulated(f"acl.rt.memcpy(kind=ACL_MEMCPY_{_KINDS[kind]}): copies to or from raw device addresses "
                          f"are not emulated; copy tensors instead (Tensor.copy_, .to('npu'), .cpu())")
    ctypes.memmove(dst, src, count)
    return ACL_SUCCESS
