"""KV-cache writes by index: npu_scatter_nd_update(_), and scatter_update(_) (TorchAir's llama examples).

vLLM-Ascend and TorchAir model code write new key/value rows into a cache with
``torch_npu.npu_scatter_nd_update_(cache, slots, rows)``.  Semantics are TensorFlow's ScatterNdUpdate:
``indices`` (..., a) addresses the first ``a`` dims of ``input``; ``updates`` has shape
``indices.shape[:-1] + input.shape[a:]`` and each of its slices replaces the addressed slice.
Out-of-range indices are a kernel error on the device; here they raise.  Duplicate indices have no
defined order on the device; here the last one wins.

``torch_npu.scatter_update_(data, indices, updates, axis)`` writes each batch's new rows into a
static cache: ``data[b]`` along ``axis`` from position ``indices[b]`` on takes ``updates[b]`` (same
rank; sizes equal but along ``axis``).  The device does not check the range; here it raises.
Two-dimensional indices are not emulated (a clear error).
"""
from __future__ import annotations

import torch

from ._common import _check
from .spec import OpSpec, generated, vector

_OP = "npu_scatter_nd_update"



def _scatter(target: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, op: str) -> None:
    """Write ``updates`` into ``target`` (in place) at the slices ``indices`` addresses."""
    _check(1 <= target.dim() <= 8, lambda: f"{op}: input must have 1 to 8 dims, but got {target.dim()}")
    _check(indices.dtype in (torch.int32, torch.int64),
           lambda: f"{op}: indices must be int32 or int64, but got {indices.dtype}")
    _check(indices.dim() >= 2, lambda: f"{op}: indices must have at least 2 dims, but got {indices.dim()}")
    depth = indices.size(-1)
    _check(depth <= target.dim(), lambda: f"{op}: the last dim of indices ({depth}) must not exceed the "
                                          f"rank of input ({target.dim()})")
    expected = tuple(indices.shape[:-1]) + tuple(target.shape[depth:])
    _check(tuple(updates.shape) == expected,
           lambda: f"{op}: updates must have shape {list(expected)} (indices.shape[:-1] + input.shape[{depth}:]), "
                   f"but got {list(updates.shape)}")
    _check(updates.dtype == target.dtype, lambda: f"{op}: updates dtype {updates.dtype} must match input dtype "
                                                  f"{target.dtype}")
    points = indices.reshape(-1, depth).to(torch.int64)
    bounds = torch.tensor(target.shape[:depth], dtype=torch.int64)
    _check(bool(((points >= 0) & (points < bounds)).all()),
           lambda: f"{op}: indices out of range for input of shape {list(target.shape)}")
    rows = updates.reshape((points.size(0),) + tuple(target.shape[depth:]))
    for point, row in zip(points.tolist(), rows):
        target[tuple(point)] = row


def npu_scatter_nd_update(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """A copy of ``self`` with the addressed slices replaced; ``self`` is unchanged."""
    out = self.clone()
    _scatter(out, indices, updates, _OP)
    return out


def npu_scatter_nd_update_(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """In place on ``self`` (declared ``Tensor(a!)``); returns ``self``."""
    _scatter(self, indices, updates, _OP + "_")
    return self



def _scatter_update(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, axis: int, op: str) -> None:
    """``data[b]`` along ``axis``, from ``indices[b]`` on, takes ``updates[b]`` (in place)."""
    _check(2 <= data.dim() <= 8, lambda: f"{op}: data must have 2 to 8 dims, but got {data.dim()}")
    _check(updates.dim() == data.dim(), lambda: f"{op}: updates must have the rank of data ({data.dim()}), but got "
                                                f"{updates.dim()}")
    _check(indices.dtype in (torch.int32, torch.int64),
           lambda: f"{op}: indices must be int32 or int64, but got {indices.dtype}")
    _check(indices.dim() == 1, lambda: f"{op}: indices with {indices.dim()} dims are not emulated (1-dimensional "
                                       f"indices, one start position per batch, are)")
    _check(updates.dtype == data.dtype, lambda: f"{op}: updates dtype {updates.dtype} must match data dtype "
                                                f"{data.dtype}")
    dim = axis % data.dim()
    _check(dim > 0, lambda: f"{op}: axis {axis} must not be the batch axis")
    batch = data.size(0)
    _check(indices.numel() == batch and updates.size(0) == batch,
           lambda: f"{op}: indices ({indices.numel()}) and updates ({updates.size(0)}) must have one entry per batch "
                   f"of data ({batch})")
    others = [i for i in range(1, data.dim()) if i != dim]
    _check(all(updates.size(i) == data.size(i) for i in others),
           lambda: f"{op}: updates {list(updates.shape)} must match data {list(data.shape)} except along axis {axis}")
    length = updates.size(dim)
    for b, start in enumerate(indices.tolist()):
        _check(0 <= start and start + length <= data.size(dim),
               lambda: f"{op}: indices[{b}] = {start} puts {length} rows past the end of axis {axis} "
                       f"(size {data.size(dim)})")
        data[b].narrow(dim - 1, start, length).copy_(updates[b])


def scatter_update(self, indices, updates, axis):
    """A copy of ``self`` (the docs' ``data``) with the rows written; ``self`` is unchanged."""
    out = self.clone()
    _scatter_update(out, indices, updates, axis, "scatter_update")
    return out


def scatter_update_(self, indices, updates, axis):
    _scatter_update(self, indices, updates, axis, "scatter_update_")
    return self

SPECS = [
    OpSpec("npu_scatter_nd_update(Tensor self, Tensor indices, Tensor updates) -> Tensor", npu_scatter_nd_update,
           vector(), meta=lambda self, indices, updates: torch.empty_like(self)),
    OpSpec("npu_scatter_nd_update_(Tensor(a!) self, Tensor indices, Tensor updates) -> Tensor(a!)",
           npu_scatter_nd_update_, vector(), meta=lambda self, indices, updates: self),
    OpSpec(generated("scatter_update"), scatter_update, vector(),
           meta=lambda self, indices, updates, axis: torch.empty_like(self)),
    OpSpec(generated("scatter_update_"), scatter_update_, vector(), meta=lambda self, indices, updates, axis: self),
]
