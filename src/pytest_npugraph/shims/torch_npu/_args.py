"""The argument conversions of torch_npu's C bindings, with CPython's and torch's exact errors.

The real ``torch_npu._C`` functions parse their arguments with ``PyArg_ParseTupleAndKeywords``
(format letters ``i``, ``b``, ``L``, ``K``) and torch's ``THPUtils_unpackLong``/``unpackUInt32``, so a
wrong type fails at the call with CPython's message.  The emulated ``_C`` converts the same way,
before anything reaches the runtime (where a string core count would otherwise crash an analysis
at test end and hide every hazard of the test).
"""
from __future__ import annotations

import operator

from pytest_npugraph.runtime.errors import ErrCode, pta_error

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_ULONG_MAX = (1 << 64) - 1


def _index(value) -> int:
    """``__index__`` as CPython's integer formats use it ("'str' object cannot be interpreted as an integer")."""
    return operator.index(value)


def _c_long(v: int) -> int:
    if not _INT64[0] <= v <= _INT64[1]:
        raise OverflowError("Python int too large to convert to C long")
    return v


def fmt_i(value) -> int:
    """``PyArg`` format ``i`` (C int)."""
    v = _c_long(_index(value))
    if v > _INT32[1]:
        raise OverflowError("signed integer is greater than maximum")
    if v < _INT32[0]:
        raise OverflowError("signed integer is less than minimum")
    return int(v)


def fmt_b(value) -> int:
    """``PyArg`` format ``b`` (unsigned char, from a Python int)."""
    v = _c_long(_index(value))
    if v < 0:
        raise OverflowError("unsigned byte integer is less than minimum")
    if v > 255:
        raise OverflowError("unsigned byte integer is greater than maximum")
    return int(v)


def fmt_L(value) -> int:
    """``PyArg`` format ``L`` (long long)."""
    v = _index(value)
    if not _INT64[0] <= v <= _INT64[1]:
        raise OverflowError("int too big to convert")
    return int(v)


def fmt_K(value, position: int) -> int:
    """``PyArg`` format ``K`` (unsigned long long, masked; ints only)."""
    if not isinstance(value, int):
        raise TypeError(f"argument {position} must be int, not {_type_name(value)}")
    return int(value) & _ULONG_MAX


def _type_name(value) -> str:
    return "None" if value is None else type(value).__name__


def parse(function: str, spec, args: tuple, kwargs: dict) -> dict:
    """``PyArg_ParseTupleAndKeywords(args, kwargs, "|...")``: ``spec`` is ((name, letter, default), ...)."""
    if len(args) > len(spec):
        raise TypeError(f"function takes at most {len(spec)} arguments ({len(args) + len(kwargs)} given)")
    names = [name for name, _, _ in spec]
    for key in kwargs:
        if key not in names:
            raise TypeError(f"'{key}' is an invalid keyword argument for this function")
    out = {}
    for position, (name, letter, default) in enumerate(spec, 1):
        if position <= len(args):
            if name in kwargs:
                raise TypeError(f"argument for function given by name ('{name}') and position ({position})")
            value = args[position - 1]
        elif name in kwargs:
            value = kwargs[name]
        else:
            out[name] = default
            continue
        out[name] = (fmt_K(value, position) if letter == "K" else
                     {"i": fmt_i, "b": fmt_b, "L": fmt_L}[letter](value))
    return out


def pybind_parse(values, letters: str) -> list:
    """A binding that replaces any parse failure with torch_npu's own ``TypeError``
    ("Pybind failed to parse parameters.")."""
    try:
        return [{"L": fmt_L, "i": fmt_i}[letter](v) if letter != "O" else v for v, letter in zip(values, letters)]
    except (TypeError, OverflowError):
        raise TypeError("Pybind failed to parse parameters." + pta_error(ErrCode.TYPE)) from None


def unpack_long(value) -> int:
    """torch's ``THPUtils_unpackLong``."""
    v = _index(value)
    if not _INT64[0] <= v <= _INT64[1]:
        raise ValueError("Overflow when unpacking long long")
    return int(v)


def unpack_uint32(value) -> int:
    """torch's ``THPUtils_unpackUInt32`` (``PyLong_AsUnsignedLong``, then a 32-bit range check)."""
    if not isinstance(value, int):
        raise TypeError("an integer is required")
    if value < 0:
        raise OverflowError("can't convert negative value to unsigned int")
    if value > _ULONG_MAX:
        raise OverflowError("Python int too large to convert to C unsigned long")
    if value > (1 << 32) - 1:
        raise ValueError("Overflow when unpacking long long")
    return int(value)


def require(value, cls, function: str, argument: str, shown: str):
    """A ``METH_O`` binding that takes a handle object: torch_npu casts without checking (undefined
    behaviour on hardware); here the wrong type is a ``TypeError`` at the call."""
    if not isinstance(value, cls):
        raise TypeError(f"{function}(): argument '{argument}' must be {shown}, not {_type_name(value)}")
    return value
