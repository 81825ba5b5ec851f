"""npugraph_ex's option values (mirrors ``configs/_option_base.py``): unlike torchair's, ``value``
reads bools as bools; the checks and error texts are the same."""
from __future__ import annotations

import os
from typing import Callable

from npugraph_ex._utils.error_code import pretty_error_msg


class OptionValue:
    def __init__(self, default, optional=None):
        self.__default = default
        self.__optional = optional
        self._value = default

    def __bool__(self):
        return bool(self._value)

    @property
    def default(self):
        return self.__default

    @property
    def optional(self):
        return self.__optional

    @property
    def value(self):
        if self._value is None:
            return None
        if isinstance(self._value, bool):
            return self._value
        return str(self._value)

    @value.setter
    def value(self, v):
        allowed = self.__optional
        if isinstance(allowed, (tuple, list)) and v not in allowed:
            raise ValueError(f"Value {repr(v)} (type: {type(v)}) not in optional list {repr(allowed)} "
                             f"(type: {None if len(allowed) == 0 else type(allowed[0])}).")
        self._value = v


class IntRangeValue(OptionValue):
    def __init__(self, default, value_min, value_max):
        super().__init__(default)
        self.__min = value_min
        self.__max = value_max

    @property
    def value(self):
        return OptionValue.value.fget(self)

    @value.setter
    def value(self, v):
        if not isinstance(v, int):
            raise ValueError(f'Please set integer type, but got {type(v)}')
        if v < self.__min or v > self.__max:
            raise ValueError(f'Please set value in [{self.__min}, {self.__max}], {str(v)} is out of range.')
        self._value = v


class IntListValue(OptionValue):
    def __init__(self, default=None):
        if default is not None and not isinstance(default, (list, tuple)):
            raise TypeError(f"default must be None or list, got {type(default)}")
        super().__init__(default, optional=None)

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        if v is not None and not isinstance(v, (list, tuple)):
            raise TypeError(f"the set value must be None or list, got {type(v)}")
        v = [] if v is None else v
        if not all(isinstance(val, int) for val in v):
            raise TypeError(f"the set value must be int list, got list type: {[type(val) for val in v]}")
        self._value = v


class DictOptionValue(OptionValue):
    def __init__(self, default=None):
        if default is not None and not isinstance(default, dict):
            raise TypeError(f"default must be dict or None, got {type(default)}")
        super().__init__(default, optional=None)

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        if v is not None and not isinstance(v, dict):
            raise TypeError(f"value must be dict or None, got {type(v)}")
        self._value = v


class CallableValue(OptionValue):
    def __init__(self, default=None):
        if default is not None and not isinstance(default, Callable):
            raise TypeError(f"default must be Callable or None, got {type(default)}")
        super().__init__(default, optional=None)

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        if v is not None and not isinstance(v, Callable):
            raise TypeError(f"value must be Callable or None, got {type(v)}")
        self._value = v


class MustExistedPathValue(OptionValue):
    @property
    def value(self):
        return OptionValue.value.fget(self)

    @value.setter
    def value(self, v):
        if v is None or not (os.path.exists(v) and os.path.isdir(v)):
            raise FileNotFoundError(f'Please set legal dir path, {str(v)} is not found or is not a file directory!')
        self._value = v


class NpuBaseConfig:
    def __init__(self):
        self._fixed_attrs = [k for k, v in self.__dict__.items() if isinstance(v, (OptionValue, NpuBaseConfig))]

    @pretty_error_msg
    def __setattr__(self, key, value):
        if hasattr(self, '_fixed_attrs'):
            if key not in self._fixed_attrs:
                raise ValueError(
                    self.__class__.__name__ + " has no option " + key + ", all options " + str(self._fixed_attrs))
            if isinstance(getattr(self, key), OptionValue):
                getattr(self, key).value = value
            else:
                super().__setattr__(key, value)
        else:
            super().__setattr__(key, value)
