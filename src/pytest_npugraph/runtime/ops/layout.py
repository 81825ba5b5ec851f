"""Layout and memory-side ops: npu_format_cast(_), npu_prefetch."""
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


def npu_format_cast(self: torch.Tensor, acl_format: int, *, customize_dtype: Optional[int] = None,
                    input_dtype: Optional[int] = None) -> torch.Tensor:
    """Storage-format change: values are unchanged (the runtime tracks the format tag)."""
    return self.clone()


def npu_format_cast_tensor(self: torch.Tensor, dst: torch.Tensor, *, customize_dtype: Optional[int] = None,
                           input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast.Tensor``: take ``dst``'s format; values unchanged."""
    return self.clone()


def npu_format_cast_inplace(self: torch.Tensor, src: torch.Tensor, *, customize_dtype: Optional[int] = None,
                            input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast_``: in-place format change, returns ``self`` with values unchanged."""
    return self


def npu_format_cast_inplace_acl_format(self: torch.Tensor, acl_format: int, *, customize_dtype: Optional[int] = None,
                                       input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast_.acl_format``: in-place format change by format number."""
    return self


_FORMAT_CAST_KW = "*, int? customize_dtype=None, int? input_dtype=None"

SPECS = [
    # A cache-maintenance (CMO) task on the L2 path: it occupies no compute cores and ignores limits.
    OpSpec("npu_prefetch(Tensor self, Tensor? dependency, int max_size, int offset=0) -> ()", npu_prefetch,
           cores("AIV", limit_applies=False)),
    # TransData is a TBE kernel: core limits are not guaranteed to reach it.
    OpSpec(f"npu_format_cast(Tensor self, int acl_format, {_FORMAT_CAST_KW}) -> Tensor", npu_format_cast,
           cores("AIV", vector="all", limit_applies=False)),
    OpSpec(f"npu_format_cast.Tensor(Tensor self, Tensor dst, {_FORMAT_CAST_KW}) -> Tensor",
           npu_format_cast_tensor, cores("AIV", vector="all", limit_applies=False)),
    OpSpec(f"npu_format_cast_(Tensor(a!) self, Tensor src, {_FORMAT_CAST_KW}) -> Tensor(a!)",
           npu_format_cast_inplace, cores("AIV", vector="all", limit_applies=False)),
    OpSpec(f"npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, {_FORMAT_CAST_KW}) -> Tensor(a!)",
           npu_format_cast_inplace_acl_format, cores("AIV", vector="all", limit_applies=False)),
]
