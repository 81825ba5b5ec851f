"""``torch_npu.Format`` and ``torch_npu.get_npu_format`` (mirrors ``torch_npu/npu/_format.py``).

The emulated device keeps every tensor in its base format: NCHW for 4-D, NCDHW for 5-D, ND
otherwise, unless an op recorded another one on the tensor (``_npu_format``)."""
from __future__ import annotations

from enum import IntEnum

import torch


class Format(IntEnum):
    """NPU storage format enumeration class"""
    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47
    FRACTAL_NZ_C0_16 = 50
    FRACTAL_NZ_C0_32 = 51
    FRACTAL_NZ_C0_2 = 52
    FRACTAL_NZ_C0_4 = 53
    FRACTAL_NZ_C0_8 = 54

    def __str__(self):
        return self.name


def get_npu_format(tensor) -> Format:
    """The storage format of an npu tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"get_npu_format(): argument 'self' (position 1) must be Tensor, not {type(tensor).__name__}")
    if tensor.device.type != "npu":
        raise RuntimeError(f"Expected an npu tensor, but got a tensor on {tensor.device}")
    fmt = getattr(tensor, "_npu_format", None)
    if fmt is None:
        payload = getattr(tensor, "_payload", None)     # the format casts tag the storage they write
        if payload is not None:
            from pytest_npugraph.runtime.ops.layout import storage_format
            return Format(storage_format(payload))
        fmt = Format.NCHW if tensor.dim() == 4 else Format.NCDHW if tensor.dim() == 5 else Format.ND
    return Format(fmt)
