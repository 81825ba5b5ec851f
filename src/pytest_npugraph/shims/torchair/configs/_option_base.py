"""Option value classes and the base of every torchair config (mirrors ``configs/_option_base.py``):
the value checks and error texts users see when a config field is set."""
from __future__ import annotations

import os
import re
from typing import Callable, Optional

from torchair._utils.error_code import pretty_error_msg


class OptionValue:
    """A config field: ``value`` reads as a string ("1"/"0" for bools), writes are checked against
    ``optional`` (a list of allowed values) when it is given.  ``bools_as_text`` is the one thing
    npugraph_ex's option values do differently: they read bools as bools."""

    bools_as_text = True

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
        v = self._value
        if v is None:
            return None
        if isinstance(v, bool) and not self.bools_as_text:
            return v
        text = str(v)
        return {"True": "1", "False": "0"}.get(text, text)

    @value.setter
    def value(self, v):
        allowed = self.__optional
        if isinstance(allowed, (list, tuple)) and v not in allowed:
            kind = None if not allowed else type(allowed[0])
            raise ValueError(f"Value {v!r} (type: {type(v)}) not in optional list {allowed!r} (type: {kind}).")
        self._value = v


class _Checked(OptionValue):
    """An option whose setter runs ``_check`` (reads stringify like ``OptionValue``)."""

    @property
    def value(self):
        return OptionValue.value.fget(self)

    @value.setter
    def value(self, v):
        self._value = self._check(v)

    def _check(self, v):
        return v


class IntRangeValue(_Checked):
    def __init__(self, default, value_min, value_max):
        super().__init__(default)
        self.__min = value_min
        self.__max = value_max

    def _check(self, v):
        if not isinstance(v, int):
            raise ValueError(f"Please set integer type, but got {type(v)}")
        if not self.__min <= v <= self.__max:
            raise ValueError(f"Please set value in [{self.__min}, {self.__max}], {v} is out of range.")
        return v


class IntListValue(_Checked):
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
        if any(not isinstance(x, int) for x in v):
            raise TypeError(f"the set value must be int list, got list type: {[type(x) for x in v]}")
        self._value = v


def _typed(kind: type, kind_name: str):
    """An option holding a ``kind`` or None (the str/dict/callable options share their checks)."""

    class Typed(_Checked):
        def __init__(self, default=None):
            if default is not None and not isinstance(default, kind):
                raise TypeError(f"default must be {kind_name} or None, got {type(default)}")
            super().__init__(default, optional=None)

        @property
        def value(self):
            return self._value if kind is not str else OptionValue.value.fget(self)

        @value.setter
        def value(self, v):
            self._value = self._check(v)

        def _check(self, v):
            if v is not None and not isinstance(v, kind):
                raise TypeError(f"value must be {kind_name} or None, got {type(v)}")
            return v

    return Typed


class StrOptionValue(_typed(str, "str")):
    pass


class DictOptionValue(_typed(dict, "dict")):
    pass


class CallableValue(_typed(Callable, "Callable")):
    pass


class FileValue(_Checked):
    def _check(self, v):
        if v is not None and not os.path.isfile(v):
            raise FileNotFoundError(f"Please set legal file path, {v} is not found or is not a file!")
        return v


class MustExistedPathValue(_Checked):
    def _check(self, v):
        if v is None or not os.path.isdir(v):
            raise FileNotFoundError(f"Please set legal dir path, {v} is not found or is not a file directory!")
        return v


class MustExistedFileAddr(_Checked):
    def _check(self, v, suffix=".json"):
        if v is not None:
            if v == "":
                raise ValueError("File path cannot be empty!")
            if not (os.path.exists(v) and v.endswith(suffix) and os.path.isfile(v)):
                raise FileNotFoundError(f"Please set legal file path, {v} is not found or is not '{suffix}' file!")
        return v


class RegexValue(_Checked):
    def __init__(self, default, regex, example):
        super().__init__(default)
        self.__regex = regex
        self.__example = example

    def _check(self, v):
        if not re.match(self.__regex, v):
            raise ValueError(f"Please set legal regex value format match {self.__regex}, {v} is Illegal format, "
                             f"correct example:{self.__example}.")
        return v


class DeprecatedValue(OptionValue):
    def __init__(self, optional, *, replacement):
        super().__init__(None, optional)
        self.replacement = replacement


class NpuBaseConfig:
    """A group of options: only the fields set in ``__init__`` exist (an unknown name raises
    ``ValueError("<Class> has no option <name>, all options [...]")``)."""

    def __init__(self):
        self._fixed_attrs = [k for k, v in self.__dict__.items() if isinstance(v, (OptionValue, NpuBaseConfig))]

    @pretty_error_msg
    def __setattr__(self, key, value):
        fixed = self.__dict__.get("_fixed_attrs")
        if fixed is None:
            return super().__setattr__(key, value)
        if key not in fixed:
            raise ValueError(f"{type(self).__name__} has no option {key}, all options {fixed}")
        current = getattr(self, key)
        if isinstance(current, OptionValue):
            current.value = value
        else:
            super().__setattr__(key, value)

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        """(local options, global options) of the set fields, as strings."""
        local_options, global_options = {}, {}
        for k, v in self.__dict__.items():
            if k not in getattr(self, "_fixed_attrs", ()):
                continue
            if isinstance(v, OptionValue) and v.value is not None:
                local_options[k] = v.value
            elif isinstance(v, NpuBaseConfig):
                local, glob = v.as_dict(mode)
                local_options.update(local)
                global_options.update(glob)
        return local_options, global_options
