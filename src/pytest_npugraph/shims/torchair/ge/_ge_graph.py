"""The GE graph builder's public types (mirrors ``torchair/ge/_ge_graph.py``): ``DataType``, ``Format``,
``Tensor``/``TensorSpec``.  The emulator runs a compiled graph's ops with their torch kernels and never
builds a GE graph, so the builder functions (what GE converters call) raise
``pytest_npugraph.NotEmulated`` (a ``NotImplementedError``) saying so: a custom op runs in the emulator through the kernel registered with ``torch.library``
(PrivateUse1/CPU), and its converter (``register_fx_node_ge_converter``) is kept but not called."""
from __future__ import annotations

from enum import Enum

from pytest_npugraph.errors import NotEmulated

_NOT_BUILT = ("pytest-npugraph does not build GE graphs: GE converters are not run (each op of a compiled graph "
              "runs its torch kernel; register a CPU or PrivateUse1 kernel for a custom op with torch.library), "
              "so torchair.ge.{name} cannot be used here")


def not_built(name: str):
    return NotEmulated(_NOT_BUILT.format(name=name))


class Format(Enum):
    FORMAT_UNDEFINED = -1
    FORMAT_NCHW = 0
    FORMAT_NHWC = 1
    FORMAT_ND = 2
    FORMAT_NC1HWC0 = 3
    FORMAT_FRACTAL_Z = 4
    FORMAT_NC1HWC0_C04 = 12
    FORMAT_HWCN = 16
    FORMAT_NDHWC = 27
    FORMAT_FRACTAL_NZ = 29
    FORMAT_NCDHW = 30
    FORMAT_NDC1HWC0 = 32
    FORMAT_FRACTAL_Z_3D = 33
    FORMAT_NC = 35
    FORMAT_NCL = 47
    FORMAT_FRACTAL_NZ_C0_16 = 50
    FORMAT_FRACTAL_NZ_C0_2 = 52
    FORMAT_FRACTAL_NZ_C0_4 = 53
    FORMAT_FRACTAL_NZ_C0_8 = 54

    __module__ = "torchair.ge"


class DataType:
    """GE's data type numbers."""
    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT32 = 8
    DT_INT64 = 9
    DT_UINT64 = 10
    DT_DOUBLE = 11
    DT_BOOL = 12
    DT_STRING = 13
    DT_COMPLEX64 = 16
    DT_COMPLEX128 = 17
    DT_BF16 = 27
    DT_UNDEFINED = 28
    DT_INT4 = 29

    __module__ = "torchair.ge"


class TensorBase:
    """A GE graph tensor (only GE converters hold them)."""

    def __init__(self, *args, **kwargs):
        raise not_built("Tensor")

    __module__ = "torchair.ge"


class TensorSpecBase:
    """The spec (dtype, shape) of a GE converter's output."""

    def __init__(self, *args, **kwargs):
        raise not_built("TensorSpec")

    __module__ = "torchair.ge"


Tensor = TensorBase
TensorSpec = TensorSpecBase


def get_default_ge_graph():
    raise not_built("get_default_ge_graph")


def next_unique_name(name, op):
    raise not_built("next_unique_name")


def compat_as_bytes(bytes_or_text, encoding="utf-8"):
    return bytes_or_text.encode(encoding) if isinstance(bytes_or_text, str) else bytes_or_text


def compat_as_bytes_list(bytes_or_text, encoding="utf-8"):
    return [compat_as_bytes(v, encoding) for v in bytes_or_text]


def get_invalid_desc():
    raise not_built("get_invalid_desc")


def auto_convert_to_tensor(inputs, dtypes, dependencies=None):
    raise not_built("auto_convert_to_tensor")
