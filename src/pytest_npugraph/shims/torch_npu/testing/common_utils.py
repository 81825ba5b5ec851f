"""``torch_npu.testing.common_utils``: tensor factories and skip decorators of the test suite."""
from __future__ import annotations

import functools
import os
import unittest
from contextlib import contextmanager
from itertools import product
from typing import List

import numpy as np
import torch

import torch_npu

PERF_TEST_ENABLE = os.getenv("PERF_TEST_ENABLE", "").upper() in ("ON", "1", "YES", "TRUE", "Y")

__all__ = ["freeze_rng_state", "iter_indices", "is_iterable", "set_npu_device", "get_npu_device",
           "create_common_tensor", "create_dtype_tensor", "test_2args_broadcast",
           "check_operators_in_prof", "SkipIfNoLapack", "SupportedDevices", "SkipIfNotGteCANNVersion",
           "PERF_TEST_ENABLE"]


@contextmanager
def freeze_rng_state():
    """Restore the CPU generator's state when the block ends."""
    saved = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(saved)


def iter_indices(tensor):
    """Every index of ``tensor`` (ints for 1-D, tuples above, nothing for a scalar)."""
    if tensor.dim() == 0:
        return range(0)
    if tensor.dim() == 1:
        return range(tensor.size(0))
    return product(*(range(n) for n in tensor.size()))


def is_iterable(obj) -> bool:
    try:
        iter(obj)
    except TypeError:
        return False
    return True


def get_npu_device() -> str:
    """``"npu:<SET_NPU_DEVICE>"``, ``"npu:0"`` when the variable is unset."""
    index = os.environ.get("SET_NPU_DEVICE")
    return "npu:0" if index is None else f"npu:{index}"


def set_npu_device() -> str:
    device = get_npu_device()
    torch.npu.set_device(device)
    return device


def _to_npu(array, device, npu_format):
    cpu = torch.from_numpy(array)
    npu = torch.from_numpy(array.copy()).to(device)
    if npu_format != -1:
        npu = torch_npu.npu_format_cast(npu, npu_format)
    return cpu, npu


def create_common_tensor(item, minValue, maxValue, device=None):
    """``item = [numpy dtype, npu format, shape]``: a uniform random CPU tensor in
    ``[minValue, maxValue)`` and its copy on the NPU (format-cast unless the format is -1)."""
    dtype, npu_format, shape = item[0], item[1], item[2]
    array = np.random.uniform(minValue, maxValue, shape).astype(dtype)
    return _to_npu(array, device or get_npu_device(), npu_format)


def create_dtype_tensor(shape, dtype, npu_format=-1, min_value=-5, max_value=5, no_zero=False, device=None):
    """A random CPU tensor of torch ``dtype`` (bool, half, float; integers otherwise, as int32)
    and its NPU copy; only floating tensors are format-cast."""
    if dtype == torch.bool:
        array = np.random.randint(0, 2, size=shape).astype(bool)
    elif dtype == torch.half:
        array = np.random.uniform(min_value, max_value, shape).astype(np.float16)
    elif dtype == torch.float:
        array = np.random.uniform(min_value, max_value, shape).astype(np.float32)
    else:
        array = np.random.randint(min_value, max_value + 1, size=shape).astype(np.int32)
    if no_zero:
        array = np.where(array != 0, array, np.ones_like(array))
    npu_format = npu_format if dtype in (torch.float, torch.half) else -1
    return _to_npu(array, device or get_npu_device(), npu_format)


def _broadcast_cases(device=None):
    device = device or get_npu_device()
    for y_shape in ((1, 1, 1), (4, 5)):
        x = np.random.rand(2, 3, 4, 5).astype(np.float32)
        y = np.random.rand(*y_shape).astype(np.float32)
        yield torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def test_2args_broadcast(fn):
    """``[[cpu result, npu result], ...]`` of ``fn`` over two broadcasting cases."""
    return [[fn(cx, cy).numpy(), fn(nx, ny).to("cpu").numpy()] for cx, cy, nx, ny in _broadcast_cases()]


test_2args_broadcast.__test__ = False   # a helper, not a test, for collectors


def check_operators_in_prof(expected_operators, prof, unexpected_operators=None):
    """Whether every expected operator and no unexpected one appears in a profile."""
    unexpected = unexpected_operators or []
    averages = prof.key_averages()
    if not averages:
        print("torch profiling is empty, please check it")
        return None
    for item in averages:
        key = item.key.replace("cached_", "")
        if key in unexpected:
            return False
        if key in expected_operators:
            expected_operators.remove(key)
    return not expected_operators


class SkipIfNoLapack:
    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not torch._C.has_lapack:
                raise unittest.SkipTest("PyTorch compiled without Lapack")
            fn(*args, **kwargs)
        return wrapper


def _device_family() -> str:
    name = torch_npu.npu.get_device_name(0)
    if name[:10] == "Ascend910_":
        return name[:12]
    if name.startswith("Ascend950"):
        return name[:9]
    return name[:10]


class SupportedDevices:
    """Skip the test unless the device's family (``"Ascend910B"``, ``"Ascend910_93"``, ...) is listed."""

    def __init__(self, supported_devices: List[str]) -> None:
        self.supported_devices = supported_devices

    def __call__(self, fn):
        @functools.wraps(fn)
        def dep_fn(slf, *args, **kwargs):
            family = _device_family()
            if family not in self.supported_devices:
                raise unittest.SkipTest(f"Only run on {self.supported_devices!r}, current device is {family}.")
            return fn(slf, *args, **kwargs)
        return dep_fn


class SkipIfNotGteCANNVersion:
    """Skip the test unless the emulated CANN version (``--npu-cann`` / ``npu_cann``) is at least
    ``base_version``."""

    def __init__(self, base_version, module="CANN"):
        self.base_version = base_version
        self.module = module

    def __call__(self, fn):
        @functools.wraps(fn)
        def func(slf, *args, **kwargs):
            from torch_npu.npu.utils import _is_gte_cann_version, get_cann_version

            if not _is_gte_cann_version(self.base_version, module=self.module):
                raise unittest.SkipTest(f"Only run on {self.base_version} or greater, current cann version is "
                                        f"{get_cann_version(module=self.module)}.")
            return fn(slf, *args, **kwargs)
        return func
