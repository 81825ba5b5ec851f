"""torch_npu.testing (the helpers torch_npu's own test suite imports): TestCase.assertRtolEqual and its
precision-aware assertEqual, create_common_tensor, SupportedDevices, Dtypes + instantiate_tests."""
import unittest

import numpy as np
import pytest
import torch
import torch_npu
from torch_npu.testing.common_utils import SupportedDevices, create_common_tensor
from torch_npu.testing.decorator import Dtypes, instantiate_tests
from torch_npu.testing.testcase import TestCase


class _Probe(TestCase):
    __test__ = False

    def runTest(self):
        pass


@pytest.fixture
def case(npugraph):
    return _Probe()


def test_rtol_equal_tolerates_prec_and_fails_beyond(case):
    x = np.linspace(1, 2, 100).astype(np.float32)
    case.assertRtolEqual(x, x * (1 + 5e-5))
    with pytest.raises(AssertionError, match="result error"):
        case.assertRtolEqual(x, x * 1.01)
    half = torch.from_numpy(x).half()
    case.assertRtolEqual(half, half * (1 + 5e-4))             # float16: prec16 = 1e-3
    with pytest.raises(AssertionError, match="dtype error"):
        case.assertRtolEqual(x, x.astype(np.float64))
    with pytest.raises(AssertionError, match="shape error"):
        case.assertRtolEqual(x, x[:50])
    case.assertRtolEqual(torch.ones(3).npu().cpu(), [1.0, 1.0, 1.0])


def test_rtol_equal_allows_a_fraction_prec_of_outliers(case):
    x = np.ones(100000, dtype=np.float32)
    y = x.copy()
    y[:5] = 2.0                         # 5 of 1e5 elements off: at most prec (1e-4) of them may be
    case.assertRtolEqual(x, y)
    y[:20] = 2.0
    with pytest.raises(AssertionError):
        case.assertRtolEqual(x, y)


def test_assert_equal_uses_the_precision(case):
    case.assertEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-6]))
    case.assertEqual(1.0, 1.0 + 1e-3, prec=1e-2)
    with pytest.raises(AssertionError):
        case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]))
    case.assertEqual({"a": [1, 2]}, {"a": [1, 2]})


def test_create_common_tensor_gives_a_cpu_tensor_and_its_npu_copy(npugraph):
    cpu, npu = create_common_tensor([np.float16, 2, (3, 4)], -1, 1)
    assert cpu.device.type == "cpu" and npu.device.type == "npu"
    assert torch.equal(cpu, npu.cpu()) and cpu.dtype == torch.float16
    assert torch_npu.get_npu_format(create_common_tensor([np.float32, 29, (16, 16)], 0, 1)[1]) == 29


@instantiate_tests
class _Generated(TestCase):
    __test__ = False      # called directly below, not collected

    @Dtypes(torch.float16, torch.float32)
    def test_add(self, dtype, device="npu"):
        return dtype, device

    @SupportedDevices(["Ascend950"])
    def test_only_on_950(self):
        pass

    @SupportedDevices(["Ascend910B"])
    def test_on_910b(self):
        return "ran"


def test_instantiate_tests_names_one_test_per_dtype(npugraph):
    assert not hasattr(_Generated, "test_add")
    assert _Generated("test_add_float16").test_add_float16() == (torch.float16, "npu")
    assert _Generated("test_add_float32").test_add_float32() == (torch.float32, "npu")


def test_supported_devices_skips_other_chip_families(npugraph):
    with pytest.raises(unittest.SkipTest, match="Only run on \\['Ascend950'\\], current device is Ascend910B"):
        _Generated("test_only_on_950").test_only_on_950()
    assert _Generated("test_on_910b").test_on_910b() == "ran"
