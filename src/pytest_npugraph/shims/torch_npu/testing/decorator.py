"""``torch_npu.testing.decorator``: dtype/format parametrisation of test methods."""
from __future__ import annotations

import functools
import inspect
import itertools

import torch

__all__ = ["Dtypes", "Formats", "instantiate_tests"]


class Dtypes:
    def __init__(self, *args):
        if not args:
            raise RuntimeError("No dtypes given")
        if not all(isinstance(arg, torch.dtype) for arg in args):
            raise RuntimeError(f"Unknown dtype in {args}")
        self.args = args

    def __call__(self, fn):
        fn.dtypes = self.args
        return fn


class Formats:
    def __init__(self, *args):
        if not args:
            raise RuntimeError("No formats given")
        self.args = args

    def __call__(self, fn):
        fn.formats = self.args
        return fn


def _bind(func, name, kwargs):
    @functools.wraps(func)
    def test(self):
        return func(self, **kwargs)
    test.__name__ = name
    test.__wrapped__ = func
    return test


def instantiate_tests(arg=None, **kwargs):
    """Class decorator: each method marked with ``Dtypes``/``Formats`` becomes one test per
    combination, named ``<name>_<format>_<dtype>``, its ``device`` argument (if any) ``"npu"``,
    and the marked method itself is removed."""

    def expand(cls):
        for name, func in list(cls.__dict__.items()):
            axes = {}
            if hasattr(func, "dtypes"):
                axes["dtype"] = func.dtypes
            if hasattr(func, "formats"):
                axes["format"] = func.formats
            if not axes:
                continue
            params = inspect.getfullargspec(func).args
            for combo in itertools.product(*axes.values()):
                call = {"device": "npu"} if "device" in params else {}
                test_name = name
                for key, value in zip(axes, combo):
                    test_name += "_" + (str(value).split(".")[1] if key == "dtype" else str(value))
                    matches = [p for p in params if key in p]
                    if len(matches) > 1:
                        raise RuntimeError(f"Multiple matches for {key}")
                    call[matches[0] if matches else None] = value
                setattr(cls, test_name, _bind(func, test_name, call))
            delattr(cls, name)
        return cls

    return expand(arg)
