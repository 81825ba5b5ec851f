"""Static shape kernels beside a core limit follow the emulated CANN release (TorchAir graph_pass.py).

Why: before CANN 9.0.0 TorchAir turns static kernels off, with a warning, in a reduce-overhead graph
that has a core limit (a static kernel has lost its tiling, so a limit could not reach it); from 9.0.0
both stay on and TorchAir's own tests expect no warning.  The release is the test's ``npu_cann``.
"""
import warnings

import pytest
import torch
import torch_npu  # noqa: F401
from torchair import scope

from .helpers import compile_with, config

WARNING = "When both static shape kernel and core limit are enabled, only core limit will take effect"


def limited(x):
    with scope.limit_core_num(4, 8):
        y = x * 2
    return y + 1


def run(static_kernel: bool, fn=limited):
    c = config("reduce-overhead")
    c.experimental_config.aclgraph._aclnn_static_shape_kernel = static_kernel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compile_with(fn, c)(torch.ones(2, device="npu"))
    assert out.cpu().tolist() == [3.0, 3.0]
    return [str(w.message) for w in caught if WARNING in str(w.message)]


def test_cann_8_5_turns_static_kernels_off_beside_a_core_limit(npugraph):
    (message,) = run(True)
    assert message.endswith("static shape kernel will be disabled. CANN 9.0.0 or later supports enabling both "
                            "features.")


@pytest.mark.npu_cann("9.0.0")
def test_cann_9_keeps_both_without_a_warning(npugraph):
    assert run(True) == []


def test_no_warning_without_static_kernels_or_without_a_limit(npugraph):
    assert run(False) == []
    assert run(True, lambda x: x * 2 + 1) == []
