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

from .tensor import NpuTensor, _is_fake


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
    if _is_fake(t._payload) or _faking():
        return None
    return NpuStorage(t._block, t._payload.untyped_storage(), t.device)


_LEGACY_NAMES = {torch.float64: "DoubleStorage", torch.float32: "FloatStorage", torch.float16: "HalfStorage",
                 torch.bfloat16: "BFloat16Storage", torch.int64: "LongStorage", torch.int32: "IntStorage",
                 torch.int16: "ShortStorage", torch.int8: "CharStorage", torch.uint8: "ByteStorage",
                 torch.bool: "BoolStorage"}


class NpuTypedStorage(torch.TypedStorage):
    """What ``Tensor.storage()`` of an NPU tensor returns: torch's ``TypedStorage`` over the payload's
    CPU storage, answering for the device.

    Why a ``TypedStorage`` subclass over the *payload* storage: ``x.set_(s, offset, size, stride)``
    hands ``s._untyped_storage`` to the op (torch's argument parser accepts any ``TypedStorage``
    instance), so the payload storage is what makes the result a view of the same CPU bytes, and
    therefore of the same block (``tensor.wrap`` finds the block by the payload storage); ``_cdata``
    (``StorageWeakRef``, torch_npu's ``t1.storage()._cdata == t2.storage()._cdata``) is that
    storage's too.  What differs from a CPU storage is answered here: ``data_ptr()`` is the block's
    simulated device address (``t.untyped_storage().data_ptr()``), ``device``/``get_device()``/
    ``is_npu``/``type()`` name the npu, ``untyped()`` is ``NpuStorage``, and reading the values
    (``s[i]``, ``tolist()``, ``cpu()``, printing) is a device-to-host read through an NPU view
    (``.item()``/``.cpu()``), so the host waits for pending device work as it does on hardware;
    ``s[i] = v`` is a device write.  The storage keeps the block alive as a real storage keeps its
    memory.
    """

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)       # TypedStorage.__new__ takes only its own signatures

    def __init__(self, block, payload_storage, dtype, device: torch.device):
        super().__init__(wrap_storage=payload_storage, dtype=dtype, _internal=True)
        self._block = block
        self._npu_device = device

    # -- what is the device's
    def _data_ptr(self) -> int:
        return 0 if self._block is None else self._block.lo

    @property
    def device(self) -> torch.device:
        return self._npu_device

    def get_device(self) -> int:
        return self._npu_device.index

    @property
    def is_npu(self) -> bool:
        return True

    def untyped(self):
        return NpuStorage(self._block, self._untyped_storage, self._npu_device)

    def type(self, dtype=None, non_blocking: bool = False):
        if dtype is None:
            name = _LEGACY_NAMES.get(self.dtype)
            return f"torch.npu.{name}" if name else "torch.storage.TypedStorage"
        return self.cpu().type(dtype, non_blocking)

    # -- values: through an NPU tensor over this storage, so reads and writes are device work
    def _as_tensor(self) -> torch.Tensor:
        return torch.empty(0, dtype=self.dtype, device=self._npu_device).set_(self)

    def _getitem(self, idx):
        if isinstance(idx, slice):
            raise RuntimeError("slices are only supported in UntypedStorage.__getitem__")
        if not isinstance(idx, int):
            raise RuntimeError(f"can't index a {type(self)} with {type(idx)}")
        return self._as_tensor()[self._maybe_wrap_index(idx)].item()

    def _setitem(self, idx, value):
        if not isinstance(idx, (int, slice)):
            raise RuntimeError(f"can't index a {type(self)} with {type(idx)}")
        if torch.is_storage(value):
            raise RuntimeError(f"cannot set item with value type {type(value)}")
        self._as_tensor()[idx] = value

    def cpu(self):
        """A host copy (one device-to-host read)."""
        host = self._as_tensor().cpu()
        return torch.TypedStorage(wrap_storage=host.untyped_storage(), dtype=self.dtype, _internal=True)

    def tolist(self):
        return self._as_tensor().tolist()

    def clone(self):
        """A copy in new device memory (a device copy task)."""
        return self._as_tensor().clone()._typed_storage()

    def _new_wrapped_storage(self, untyped_storage):
        return torch.TypedStorage(wrap_storage=untyped_storage, dtype=self.dtype, _internal=True)

    def __reduce__(self):
        raise TypeError("pytest-npugraph: pickling an NPU storage on its own is not emulated; pickle the tensor "
                        "(torch.save(t)) instead")


def typed_storage(t):
    """``t.storage()`` / ``t._typed_storage()`` of an NPU tensor (None while faking: torch's own)."""
    if _is_fake(t._payload) or _faking():
        return None
    return NpuTypedStorage(t._block, t._payload.untyped_storage(), t.dtype, t.device)


# ------------------------------------------------------------------ NpuTensor's storage methods
def _npu_untyped_storage(self):
    """The block's storage (``NpuStorage``): ``data_ptr()`` is the device address."""
    found = untyped_storage(self)
    return torch.Tensor.untyped_storage(self) if found is None else found


def _npu_typed_storage(self):
    """``t.storage()``: ``NpuTypedStorage``, a TypedStorage over the payload's storage whose
    ``data_ptr()`` is the device address and whose values are read from the device."""
    found = typed_storage(self)
    if found is None:
        return torch.TypedStorage(wrap_storage=torch.Tensor.untyped_storage(self), dtype=self.dtype, _internal=True)
    return found


def _npu_set_(self, *args, **kwargs):
    """``t.set_(storage, ...)`` also takes what ``untyped_storage()`` returns (``NpuStorage``, which
    torch's argument parser does not know): its payload storage is the storage set."""
    if any(isinstance(a, NpuStorage) for a in args) or isinstance(kwargs.get("source"), NpuStorage):
        args = tuple(a._payload_storage if isinstance(a, NpuStorage) else a for a in args)
        if isinstance(kwargs.get("source"), NpuStorage):
            kwargs = dict(kwargs, source=kwargs["source"]._payload_storage)
    return torch.Tensor.set_(self, *args, **kwargs)


def install() -> None:
    """Give ``NpuTensor`` its storage methods (here, so the tensor module need not import this one)."""
    NpuTensor.untyped_storage = _npu_untyped_storage
    NpuTensor._typed_storage = _npu_typed_storage
    NpuTensor.set_ = _npu_set_
