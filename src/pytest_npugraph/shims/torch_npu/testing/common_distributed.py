"""``torch_npu.testing.common_distributed``: multi-device skip helpers."""
from __future__ import annotations

import functools
import unittest
from collections import namedtuple

import torch

TestSkip = namedtuple("TestSkip", "exit_code, message")
TEST_SKIPS = {"multi-npu": TestSkip(75, "Multi-NPU condition not satisfied"),
              **{f"multi-npu-{n}": TestSkip(75, f"Need at least {n} ASCEND devices") for n in range(1, 9)},
              "hccl": TestSkip(76, "c10d not compiled with HCCL support"),
              "known_issues": TestSkip(77, "Test skipped due to known issues")}


def skipIfUnsupportMultiNPU(npu_number_needed):
    """Skip the test unless at least ``npu_number_needed`` devices are visible."""
    def decorate(func):
        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            if not torch.npu.is_available() or torch.npu.device_count() < npu_number_needed:
                raise unittest.SkipTest(f"Multi-NPU {npu_number_needed} condition not satisfied")
            return func(self, *args, **kwargs)
        return wrapper
    return decorate
