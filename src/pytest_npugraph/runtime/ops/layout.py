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


# ----------------------------------------------------------------------------- storage sizes
# torch_npu's FormatHelper: each format's storage shape from the tensor's sizes and item size; the
# storage holds prod(storage shape) items.  Padded formats round dimensions up to 16-element blocks
# (and FRACTAL_NZ's last one to 32-byte blocks: C0 = 32 / min(itemsize, 2), so 16 for fp16/bf16 and
# fp32, 32 for int8).
_BLOCK, _BLOCK_BYTES = 16, 32
_NZ_C0 = {50: 16, 51: 32, 52: 2, 53: 4, 54: 8}      # FRACTAL_NZ_C0_<n>


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _less_to_4(dims) -> list:
    """NCHW view of a tensor of rank < 4 (C, CH, CHW reshape types)."""
    dims = list(dims)
    if len(dims) > 4:
        raise RuntimeError(f"dims of NCHW shape should not be greater than 4, which is {len(dims)}")
    return {0: [1, 1, 1, 1], 1: [1] + dims + [1, 1], 2: [1] + dims + [1], 3: [1] + dims, 4: dims}[len(dims)]


def storage_shape(sizes, itemsize: int, acl_format: int) -> list:
    """The shape of the NPU storage of a tensor of ``sizes`` in format ``acl_format``."""
    dims = list(sizes)
    if acl_format in (29,) or acl_format in _NZ_C0:
        nz = dims + [1] * (2 - len(dims)) if len(dims) < 2 else dims
        c0 = _NZ_C0.get(acl_format, _BLOCK_BYTES // min(itemsize, 2))
        return nz[:-2] + [_ceil(nz[-1], c0), _ceil(nz[-2], _BLOCK), _BLOCK, c0]
    if acl_format == 3:         # NC1HWC0
        n, c, h, w = _less_to_4(dims) if len(dims) < 4 else dims[:4]
        return [n, _ceil(c, _BLOCK), h, w, _BLOCK]
    if acl_format == 4:         # FRACTAL_Z
        n, c, h, w = _less_to_4(dims) if len(dims) < 4 else dims[:4]
        return [_ceil(c, _BLOCK) * h * w, _ceil(n, _BLOCK), _BLOCK, _BLOCK]
    if acl_format in (32, 33) and len(dims) < 5:
        raise RuntimeError(f"dim ({', '.join(map(str, dims))}) cannot convert to "
                           f"{'NDC1HWC0' if acl_format == 32 else 'FRACTAL_Z_3D'}")
    if acl_format == 32:        # NDC1HWC0
        n, c, d, h, w = dims[:5]
        return [n, d, _ceil(c, _BLOCK), h, w, _BLOCK]
    if acl_format == 33:        # FRACTAL_Z_3D
        n, c, d, h, w = dims[:5]
        return [d * _ceil(c, _BLOCK) * h * w, _ceil(n, _BLOCK), _BLOCK, _BLOCK]
    if acl_format == 0 and len(dims) < 4:
        return _less_to_4(dims)
    return dims


def storage_nbytes(sizes, dtype: torch.dtype, acl_format: int) -> int:
    """Bytes of the NPU storage torch_npu allocates for a tensor of ``sizes`` and ``dtype`` in ``acl_format``
    (the FRACTAL_NZ storage of a (15, 17) fp16 tensor: 2 x 1 x 16 x 16 items, 1024 bytes)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = 1
    for n in storage_shape(sizes, itemsize, acl_format):
        count *= n
    return count * itemsize


def formatted_empty(sizes, dtype: torch.dtype, acl_format: int) -> torch.Tensor:
    """An uninitialised contiguous (logical order) tensor whose storage is the size torch_npu gives
    ``acl_format``, tagged with that format."""
    sizes = list(sizes)
    itemsize = torch.empty((), dtype=dtype).element_size()
    items = max(_ceil(storage_nbytes(sizes, dtype, acl_format), itemsize), 1)
    numel = 1
    for n in sizes:
        numel *= n
    storage = torch.empty(max(items, numel), dtype=dtype)
    return _tag(storage[:numel].view(sizes), acl_format)


def npu_format_cast(self: torch.Tensor, acl_format: int, *, customize_dtype: Optional[int] = None,
                    input_dtype: Optional[int] = None) -> torch.Tensor:
    """Storage-format change: a copy with the same values in a storage of format ``acl_format``, sized as
    torch_npu sizes it (to the input's own format it is the input itself: see ``same_format_cast``)."""
    out = formatted_empty(self.shape, self.dtype, acl_format)
    out.copy_(self)
    return out


def same_format_cast(args, kwargs) -> bool:
    """Whether an ``npu_format_cast`` call asks for the format its input already has: torch_npu then
    returns the input tensor itself, with no kernel (the payload form of ``args``: CPU tensors)."""
    self = args[0]
    if len(args) > 1:
        target = args[1]
    else:
        target = kwargs.get("acl_format", kwargs.get("dst"))
    if isinstance(target, torch.Tensor):
        target = storage_format(target)
    return target is not None and int(target) == storage_format(self) and not self.requires_grad


def _format_cast_setup(ctx, inputs, output, keyword_only_inputs=None):
    pass


def _format_cast_grad(ctx, grad):
    """torch_npu's npu_format_cast is differentiable: the values are unchanged, so the gradient passes
    through (the acl_format and dtype arguments get none)."""
    return grad, None


def npu_format_cast_tensor(self: torch.Tensor, dst: torch.Tensor, *, customize_dtype: Optional[int] = None,
                           input_dtype: Optional[int] = None) -> torch.Tensor:
    """``npu_format_cast.Tensor``: a copy in ``dst``'s format; values unchanged."""
    return npu_format_cast(self, storage_format(dst))


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
