"""``torch_npu.testing.testcase``: the ``TestCase`` of torch_npu's test suite and ``run_tests``.

``assertRtolEqual(x, y, prec=1e-4, prec16=1e-3)`` compares a CPU reference with an NPU result:
shapes and dtypes must match; booleans exactly; bfloat16 pairs with ``allclose(rtol=atol=prec16)``;
float16 with tolerance ``prec16``, other numbers with ``prec``; it fails only when more than
``prec`` of the elements miss both the absolute and the relative tolerance (NaNs must coincide).
``assertEqual(x, y, prec=None)`` is the precision-aware comparison (max absolute difference at
most ``prec``, default ``self.precision`` = 1e-5) over numbers, tensors, containers and dicts.
"""
from __future__ import annotations

import os
import random
import sys
import unittest
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from numbers import Number

import numpy as np
import torch

from torch_npu.testing.common_utils import is_iterable, set_npu_device

try:  # the real TestCase derives from expecttest's (assertExpected...); fall back to unittest's
    import expecttest as _expecttest
    _Base = _expecttest.TestCase
except ImportError:  # pragma: no cover - depends on the environment
    _Base = unittest.TestCase

__all__ = ["TestCase", "run_tests"]

_MINIMUM16 = 6e-8
_MINIMUM = 1e-9
_NUMPY_DTYPES = (np.bool_, np.uint16, np.int16, np.int32, np.float16, np.float32, np.int8, np.uint8,
                 np.int64, np.float64)


def run_tests():
    """Run the calling module's tests with unittest (under pytest the tests are collected directly)."""
    unittest.main(argv=sys.argv)


class TestCase(_Base):
    _precision = 1e-5
    maxDiff = None
    exact_dtype = False

    @property
    def precision(self):
        return self._precision

    @precision.setter
    def precision(self, prec):
        self._precision = prec

    @classmethod
    def setUpClass(cls):
        cls.npu_device = set_npu_device()

    def setUp(self):
        seed = int(os.getenv("SEED", "666"))
        torch.manual_seed(seed)
        random.seed(seed)

    # ---- assertRtolEqual ------------------------------------------------------------------------
    def assertRtolEqual(self, x, y, prec=1.e-4, prec16=1.e-3, auto_trans_dtype=False, message=None):
        if isinstance(x, Sequence) and isinstance(y, Sequence):
            for a, b in zip(x, y):
                self.assertRtolEqual(a, b, prec, prec16, auto_trans_dtype, message)
            return
        if isinstance(x, torch.Tensor) and isinstance(y, Sequence):
            y = torch.as_tensor(y, dtype=x.dtype, device=x.device)
        elif isinstance(x, Sequence) and isinstance(y, torch.Tensor):
            x = torch.as_tensor(x, dtype=y.dtype, device=y.device)
        if torch.is_tensor(x) and torch.is_tensor(y):
            if auto_trans_dtype:
                x = x.to(y.dtype)
            if x.dtype == torch.bfloat16 and y.dtype == torch.bfloat16:
                if x.shape != y.shape:
                    self.fail("shape error!")
                if not torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=prec16, atol=prec16):
                    self.fail("result error!")
                return
            x = x.detach().cpu().numpy()
            y = y.detach().cpu().numpy()
        elif isinstance(x, Number) and isinstance(y, Number):
            x, y = np.array(x), np.array(y)
        if x.shape != y.shape:
            self.fail("shape error")
        if x.dtype != y.dtype:
            self.fail("dtype error")
        if x.dtype.type not in _NUMPY_DTYPES:
            self.fail("required dtype in [np.bool_, np.uint16, np.int16, np.int32, np.float16, "
                      "np.float32, np.int8, np.uint8, np.int64]")
        if x.dtype == np.bool_:
            if not np.equal(x, y).all():
                self.fail("result error")
            return
        tolerance, minimum = (prec16, _MINIMUM16) if x.dtype == np.float16 else (prec, _MINIMUM)
        self._compare_rtol(x, y, tolerance, minimum, message)

    def _compare_rtol(self, x, y, tolerance, minimum, message):
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        if not np.array_equal(nan_x, nan_y):
            self.fail(message)
        diff = np.abs(y - x)
        if nan_x.any():
            diff[nan_x] = 0
        scale = np.maximum(np.abs(x), np.abs(y))
        abs_ok = diff <= tolerance
        rel_ok = diff / (scale + minimum) <= tolerance
        if rel_ok.all() or abs_ok.all():
            return
        allowed = x.size * tolerance
        if np.sum(~rel_ok) > allowed and np.sum(~abs_ok) > allowed:
            self.fail("result error")

    # ---- assertEqual with a precision ------------------------------------------------------------
    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None):
        if exact_dtype is None:
            exact_dtype = self.exact_dtype
        if isinstance(prec, str) and message == "":
            message, prec = prec, None
        if prec is None:
            prec = self.precision
        self._equal(x, y, prec, message, allow_inf, exact_dtype)

    def _equal(self, x, y, prec, message, allow_inf, exact_dtype):
        base = super(TestCase, self)
        if isinstance(x, Number) or isinstance(y, Number):
            self._number_equal(x, y, prec, message, allow_inf)
        elif isinstance(x, np.bool_) or isinstance(y, np.bool_):
            x = x.item() if isinstance(x, torch.Tensor) else x
            y = y.item() if isinstance(y, torch.Tensor) else y
            base.assertEqual(x, y, message)
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            self._tensor_equal(x, y, prec, message, allow_inf, exact_dtype)
        elif isinstance(x, (str, bytes)) and isinstance(y, (str, bytes)):
            base.assertEqual(x, y, message)
        elif type(x) is set and type(y) is set:
            base.assertEqual(x, y, message)
        elif isinstance(x, dict) and isinstance(y, dict):
            if isinstance(x, OrderedDict) and isinstance(y, OrderedDict):
                self._equal(list(x.items()), list(y.items()), prec, message, allow_inf, exact_dtype)
            else:
                self._equal(set(x), set(y), prec, message, allow_inf, exact_dtype)
                keys = list(x)
                self._equal([x[k] for k in keys], [y[k] for k in keys], prec, message, allow_inf, exact_dtype)
        elif is_iterable(x) and is_iterable(y):
            base.assertEqual(len(x), len(y), message)
            for a, b in zip(x, y):
                self._equal(a, b, prec, message, allow_inf, exact_dtype)
        else:
            base.assertEqual(x, y, message)

    def _number_equal(self, x, y, prec, message, allow_inf):
        if isinstance(x, torch.Tensor):
            x = x.item()
        if isinstance(y, torch.Tensor):
            y = y.item()
        if abs(x) == float("inf") or abs(y) == float("inf"):
            if not allow_inf:
                self.fail(f"Expected finite numeric values - x={x}, y={y}")
            super(TestCase, self).assertEqual(x, y, message)
            return
        super(TestCase, self).assertLessEqual(abs(x - y), prec, message)

    def _tensor_equal(self, a, b, prec, message, allow_inf, exact_dtype):
        base = super(TestCase, self)
        base.assertEqual(a.is_sparse, b.is_sparse, message)
        if a.is_sparse:
            a, b = a.coalesce(), b.coalesce()
            self._tensor_equal(a._indices(), b._indices(), prec, message, allow_inf, exact_dtype)
            self._tensor_equal(a._values(), b._values(), prec, message, allow_inf, exact_dtype)
            return
        base.assertEqual(a.size(), b.size(), message)
        if exact_dtype:
            base.assertEqual(a.dtype, b.dtype)
        if a.numel() == 0:
            return
        if a.device.type == "cpu" and a.dtype in (torch.float16, torch.bfloat16):
            a = a.to(torch.float32)
        b = b.to(a)
        if a.dtype == torch.bool:
            a, b = a.to(torch.int), b.to(torch.int)
        diff = a - b
        if a.dtype.is_floating_point or a.dtype.is_complex:
            nan_mask = torch.isnan(a)
            self.assertTrue(torch.equal(nan_mask, torch.isnan(b)), message)
            diff[nan_mask] = 0
            if allow_inf:
                inf_mask = torch.isinf(a)
                self.assertTrue(torch.equal(inf_mask.sign(), torch.isinf(b).sign()), message)
                diff[inf_mask] = 0
        if diff.is_signed() and diff.dtype != torch.int8:
            diff = diff.abs()
            if diff.is_complex():
                diff = diff.real
        base.assertLessEqual(diff.max(), prec, message)

    def assertAlmostEqual(self, x, y, places=None, msg=None, delta=None, allow_inf=None):
        prec = 10 ** (-places) if places else delta
        self.assertEqual(x, y, prec, msg, allow_inf)

    def assertNotEqual(self, x, y, prec=None, message=""):
        if isinstance(prec, str) and message == "":
            message, prec = prec, None
        if prec is None:
            prec = self.precision
        base = super(TestCase, self)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.size() != y.size():
                base.assertNotEqual(x.size(), y.size())
                return
            self.assertGreater(x.numel(), 0)
            y = y.type_as(x)
            nan_mask = x != x
            if torch.equal(nan_mask, y != y):
                if x.dtype == torch.bool:
                    x, y = x.to(torch.int), y.to(torch.int)
                diff = x - y
                if diff.is_signed():
                    diff = diff.abs()
                diff[nan_mask] = 0
                self.assertGreaterEqual(diff.max().item(), prec, message)
        elif isinstance(x, str) and isinstance(y, str) or is_iterable(x) and is_iterable(y):
            base.assertNotEqual(x, y)
        else:
            try:
                self.assertGreaterEqual(abs(x - y), prec, message)
                return
            except (TypeError, AssertionError):
                pass
            base.assertNotEqual(x, y, message)

    def assertObjectIn(self, obj, iterable):
        if not any(elem is obj for elem in iterable):
            raise AssertionError("object not found in iterable")

    def assertNotWarn(self, call_fn, msg=""):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call_fn()
        self.assertTrue(len(caught) == 0, msg)

    @contextmanager
    def maybeWarnsRegex(self, category, regex=""):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message=regex, category=category)
            yield
        if caught:
            self.fail("Caught unexpected warnings:\n" + "".join(
                warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) + "\n"
                for w in caught))
