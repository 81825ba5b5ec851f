"""Layout and memory-side ops: npu_format_cast(_), npu_prefetch, and the storage-format tag.

An NPU storage has a format (ND, NCHW, FRACTAL_NZ, ...; the ``torch_npu.Format`` numbers).  Values on
the emulated device are always kept in their logical (ND) order; the format is a tag on the storage,
set by the format casts and read by ``torch_npu.get_npu_format``.  Views share their storage's tag, as
they share the storage's format on the device.  A storage nobody cast has the base format of its
tensor's rank: NCHW for 4-D, NCDHW for 5-D, ND otherwise.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._common import _check
from .spec import OpSpec, cores


# ----------------------------------------------------------------------------- side-effect / format ops
def npu_prefetch(self: torch.Tensor, dependency: Optional[torch.Tensor], max_size: int, offset: int = 0) -> None:
    """L2 prefetch hint: no numeric effect; only the argument checks of the meta kernel."""
    _check(max_size > 0, lambda: f"The max_size should be greater than zero, but got {max_size}.")
    _check(offset >= 0, lambda: f"The offset should be nonnegative, but got {offset}.")


_NCHW, _ND, _NCDHW = 0, 2, 30
_FORMAT_TAG = "_npu_format"


def storage_format(t: torch.Tensor) -> int:
    """The format number of the storage behind ``t`` (a CPU payload): its tag, else the rank's base format."""
    tag = getattr(t.untyped_storage(), _FORMAT_TAG, None)
    if tag is not None:
        return tag
    return _NCHW if t.dim() == 4 else _NCDHW if t.dim() == 5 else _ND


def _tag(t: torch.Tensor, acl_format: int) -> torch.Tensor:
    setattr(t.untyped_storage(), _FORMAT_TAG, int(acl_format))
    return t


def npu_format_cast(self: torch.Tensor, acl_format: int, *, customize_dtype: Optional[int] = None,
                    input_dtype: Optional[int] = None) -> torch.Tensor:
    """Storage-format change: a copy with the same values in a storage of format ``acl_format``."""
    return _tag(self.clone(), acl_format)


def _format_cast_setup(ctx, inputs, output, keyword_only_inputs=None):
    pass


def _format_cast_grad(ctx, grad):
    """torch_npu's npu_format_cast is differentiable: the values are unchanged, so the gradient passes
    through (the acl_format and dtype arguments get none)."""
    return grad, None


def npu_format_cast_tensor(self: torch.Tensor, dst: torch.Tensor, *, customize_dtype: Optional[int] = None,
                           input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast.Tensor``: a copy in ``dst``'s format; values unchanged."""
    return _tag(self.clone(), storage_format(dst))


def npu_format_cast_inplace(self: torch.Tensor, src: torch.Tensor, *, customize_dtype: Optional[int] = None,
                            input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast_``: ``self``'s storage takes ``src``'s format; returns ``self``, values unchanged."""
    return _tag(self, storage_format(src))


def npu_format_cast_inplace_acl_format(self: torch.Tensor, acl_format: int, *, customize_dtype: Optional[int] = None,
                                       input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast_.acl_format``: in-place format change by format number."""
    return _tag(self, acl_format)


_FORMAT_CAST_KW = "*, int? customize_dtype=None, int? input_dtype=None"

SPECS = [
    # A cache-maintenance (CMO) task on the L2 path: it occupies no compute cores and ignores limits.
    OpSpec("npu_prefetch(Tensor self, Tensor? dependency, int max_size, int offset=0) -> ()", npu_prefetch,
           cores("AIV", limit_applies=False)),
    # TransData is a TBE kernel: core limits are not guaranteed to reach it.
    OpSpec(f"npu_format_cast(Tensor self, int acl_format, {_FORMAT_CAST_KW}) -> Tensor", npu_format_cast,
           cores("AIV", vector="all", limit_applies=False), autograd=(_format_cast_setup, _format_cast_grad)),
    OpSpec(f"npu_format_cast.Tensor(Tensor self, Tensor dst, {_FORMAT_CAST_KW}) -> Tensor",
           npu_format_cast_tensor, cores("AIV", vector="all", limit_applies=False)),
    OpSpec(f"npu_format_cast_(Tensor(a!) self, Tensor src, {_FORMAT_CAST_KW}) -> Tensor(a!)",
           npu_format_cast_inplace, cores("AIV", vector="all", limit_applies=False)),
    OpSpec(f"npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, {_FORMAT_CAST_KW}) -> Tensor(a!)",
           npu_format_cast_inplace_acl_format, cores("AIV", vector="all", limit_applies=False)),
]
