"""Copying and saving NPU tensors: ``copy.deepcopy``, ``pickle`` and ``torch.save``/``torch.load``.

An NPU tensor is a wrapper whose own storage holds no bytes (its values live in a CPU payload), so
torch's storage-based protocols would read a storage that does not exist (a segfault in deepcopy,
"invalid python storage" in ``torch.save``).  Here a deepcopy is a device-to-device copy into a new
block, and a saved NPU tensor is its payload plus the device: its storage is saved with location
``npu:N`` (so ``torch.load(..., map_location="cpu")`` gives CPU tensors, as with real checkpoints) and
loading without a map puts it back on that NPU.  ``torch.load``'s default ``weights_only=True`` accepts
the rebuild function (registered as a safe global).
"""
from __future__ import annotations

import copy
import re

import torch

from .device_index import device_index
from .runtime import current
from .tensor import NpuTensor, _is_fake, _launch, block_of_storage, read_to_host, wrap

# the payload storage of a saved/loaded NPU tensor carries its device here (storages keep their
# Python object, so every view and the serializer's location tagger see the same attribute)
_DEVICE_ATTR = "_npugraph_npu_device"
_INTERNAL = ("_payload", "_block", "_graph_call", "_span_memo")
_LOCATION = re.compile(r"^npu(:(\d+))?$")
_installed = False


def _state(t) -> dict:
    """The subclass attributes a copy keeps (``_is_param``, user attributes), not the emulator's."""
    return {k: v for k, v in t.__dict__.items() if k not in _INTERNAL}


def deepcopy(t, memo):
    """``copy.deepcopy`` of an NPU tensor: a copy task into a new block; views of one storage stay
    views of one copied storage (the memo), and ``Parameter``-ness, ``requires_grad`` and ``.grad`` carry over."""
    if id(t) in memo:
        return memo[id(t)]
    if not t.is_leaf:
        raise RuntimeError(
            "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the "
            "moment.  If you were attempting to deepcopy a module, this may be because of a "
            "torch.nn.utils.weight_norm usage, see https://github.com/pytorch/pytorch/pull/103001")
    p = t._payload
    with torch.no_grad():
        if _is_fake(p):
            new = t.clone()
        else:
            storage = copy.deepcopy(p.untyped_storage(), memo)
            payload = torch.empty((0,), dtype=p.dtype).set_(storage, p.storage_offset(), p.size(), p.stride())
            fresh = storage.nbytes() > 0 and block_of_storage(storage.data_ptr()) is None
            new = wrap(payload, t.device.index)
            if fresh:
                _launch("aten::clone (deepcopy)", t.device.index, [t], [new])
        if t.requires_grad:
            new.requires_grad_()
        if t.grad is not None:
            new.grad = deepcopy(t.grad, memo)
    for key, value in _state(t).items():
        setattr(new, key, copy.deepcopy(value, memo))
    memo[id(t)] = new
    return new


def reduce(t, proto):
    """``pickle``/``torch.save``: a device-to-host read, then ``rebuild(payload, device, ...)``."""
    p = t._payload
    if _is_fake(p):
        raise RuntimeError(f"Cannot pickle a tensor without data (a {type(p).__name__} on {t.device}): "
                           "save real tensors, outside torch.compile tracing")
    if t._block is not None:
        read_to_host(current(), t, "aten::_to_copy (save)")
    setattr(p.untyped_storage(), _DEVICE_ATTR, t.device.index)
    return rebuild, (p.detach(), t.device.index, t.requires_grad, _state(t))


def rebuild(payload, device_index, requires_grad, state):
    """The loaded tensor: on ``npu:N`` when its storage was loaded to an NPU (no ``map_location``, or
    one naming ``npu``), else the CPU tensor ``map_location`` asked for."""
    index = getattr(payload.untyped_storage(), _DEVICE_ATTR, None)
    t = payload if index is None else wrap(payload, index)
    if requires_grad:
        t.requires_grad_()
    for key, value in state.items():
        setattr(t, key, value)
    return t


def _tag(storage):
    """The save-time location of a storage: ``npu:N`` for an NPU tensor's payload."""
    index = getattr(storage, _DEVICE_ATTR, None)
    if index is None and isinstance(storage, torch.storage.TypedStorage):
        index = getattr(storage._untyped_storage, _DEVICE_ATTR, None)
    return None if index is None else f"npu:{index}"


def _deserialize(storage, location):
    """Loading a storage saved on (or mapped to) ``npu[:N]``: it stays the CPU payload, marked for
    ``rebuild``; a device the test's machine lacks fails as ``torch.load`` does on a real one."""
    match = _LOCATION.match(location) if isinstance(location, str) else None
    if match is None:
        return None
    rt = current()
    index = device_index(location)
    if index >= len(rt.devices):
        raise RuntimeError(f"Attempting to deserialize object on NPU device {index} but "
                           f"torch.npu.device_count() is {len(rt.devices)}. Please use torch.load with "
                           "map_location to map your storages to an existing device.")
    untyped = storage._untyped_storage if isinstance(storage, torch.storage.TypedStorage) else storage
    setattr(untyped, _DEVICE_ATTR, index)
    return storage


def install() -> None:
    """Register the ``npu`` location with torch.serialization (before torch's own PrivateUse1 entry,
    which would try to make an npu storage) and allow ``rebuild`` in ``weights_only`` loads."""
    global _installed
    if _installed:
        return
    NpuTensor.__deepcopy__ = deepcopy      # here, so the tensor module need not import this one
    NpuTensor.__reduce_ex__ = reduce
    torch.serialization.register_package(9, _tag, _deserialize)
    torch.serialization.add_safe_globals([rebuild])
    _installed = True
