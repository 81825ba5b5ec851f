"""What ``untyped_storage()`` of an NPU tensor returns: a view of its block.

The wrapper tensor's own storage holds no bytes (``data_ptr()`` on it raises "invalid python
storage"), yet user code compares storages by address (tied-weight detection, checkpoint
deduplication, buffer reuse).  ``NpuStorage`` answers with the block's simulated device address, the
same address space as ``Tensor.data_ptr()``, and the size of the payload's storage; anything else is
the payload storage's.  While Dynamo fakes inputs the wrapper's own storage is returned, as torch
expects there.
"""
from __future__ import annotations

import sys

import torch


class NpuStorage:
    """The storage of an NPU tensor (see the module docstring)."""

    __slots__ = ("_tensor_block", "_payload_storage", "_device", "__weakref__")

    def __init__(self, block, payload_storage, device: torch.device):
        self._tensor_block = block
        self._payload_storage = payload_storage
        self._device = device

    def data_ptr(self) -> int:
        return 0 if self._tensor_block is None else self._tensor_block.lo

    def nbytes(self) -> int:
        return self._payload_storage.nbytes()

    def size(self) -> int:
        return self._payload_storage.nbytes()

    def __len__(self) -> int:
        return self._payload_storage.nbytes()

    def element_size(self) -> int:
        return 1

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_cuda(self) -> bool:
        return False

    @property
    def is_npu(self) -> bool:
        return True

    def type(self) -> str:
        return "torch.npu.UntypedStorage"

    def cpu(self):
        """A host copy of the bytes (torch's ``UntypedStorage.cpu``)."""
        return self._payload_storage.clone()

    def tolist(self) -> list:
        return self._payload_storage.tolist()

    def __eq__(self, other) -> bool:
        return isinstance(other, NpuStorage) and other._payload_storage is self._payload_storage

    def __hash__(self) -> int:
        return hash(id(self._payload_storage))

    def __repr__(self) -> str:
        return f"NpuStorage(device={self._device}, nbytes={self.nbytes()}, data_ptr={self.data_ptr():#x})"

    def __getattr__(self, name):
        # everything else torch's UntypedStorage offers, on the payload (pickling is NpuTensor's)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._payload_storage, name)


def _faking() -> bool:
    guards = sys.modules.get("torch._guards")
    return guards is not None and guards.TracingContext.try_get() is not None


def untyped_storage(t):
    from .tensor import _is_fake

    if _is_fake(t._payload) or _faking():
        return None
    return NpuStorage(t._block, t._payload.untyped_storage(), t.device)
