"""Alias identity of NPU tensors: ``torch._C._is_alias_of(a, b)`` compares the storages of the
tensors themselves, and an NPU tensor's storage is its wrapper's, one per tensor.  The question is
whether the device memory is shared, which the payloads answer (a view's payload is a view of its
base's payload), so for NPU tensors it is asked of the payloads: ``x[1:]`` aliases ``x`` as on a CPU
tensor, and so does a compiled function's output that is a view of its input.  (``storage_offset``,
``untyped_storage().data_ptr()`` and ``is_set_to`` already answer from the payloads.)"""
from __future__ import annotations

import torch

_original = None


def _payload(t):
    return getattr(t, "_payload", t)


def _is_alias_of(a, b) -> bool:
    from .tensor import NpuTensor

    if isinstance(a, NpuTensor) or isinstance(b, NpuTensor):
        if isinstance(a, NpuTensor) != isinstance(b, NpuTensor):
            return False                    # device memory never aliases host memory
        return _original(_payload(a), _payload(b))
    return _original(a, b)


def install() -> None:
    global _original
    if _original is None:
        _original = torch._C._is_alias_of
        torch._C._is_alias_of = _is_alias_of
