"""Emulated ``torch_npu.multiprocessing.reductions``: pickling NPU tensors and events for other processes.

torch_npu hands another process an IPC handle to the same device memory.  An emulated NPU tensor's
values live in a CPU payload of this process, so here the handle names a CPU shared-memory copy of
the tensor's storage taken when it is pickled (after the work queued on it completes: the copy is a
device-to-host read); the receiving process (or this one) rebuilds an NPU tensor on
``storage_device`` over that memory.  Differences from hardware: later writes by the producer are
not seen by the consumer (and the other way round), and the consumer's tensor is a new block of
its own device.  ``rebuild_npu_tensor`` keeps torch_npu's 15 parameters, so code that wraps or
re-points it (SGLang's device-index patch) works unchanged.
"""
import multiprocessing

import torch
from torch.multiprocessing.reductions import rebuild_meta_tensor, rebuild_tensor, reduce_nested_tensor, shared_cache

__all__ = ["rebuild_npu_event", "rebuild_npu_tensor"]


def rebuild_npu_event(device, handle):
    return torch.npu.Event.from_ipc_handle(device, handle)


def _npu_reduce_event(event):
    handle = event.ipc_handle()
    return (rebuild_npu_event, (event.device, handle))


def _device_index(storage_device) -> int:
    if isinstance(storage_device, torch.device):
        return 0 if storage_device.index is None else storage_device.index
    if isinstance(storage_device, str):
        return torch.device(storage_device).index or 0
    return int(storage_device)


def rebuild_npu_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, storage_device,
                       storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad, ref_counter_handle,
                       ref_counter_offset, event_handle, event_sync_required):
    from pytest_npugraph.runtime.tensor import wrap

    torch.npu._lazy_init()
    index = _device_index(storage_device)
    if storage_handle is None or storage_size_bytes == 0:
        payload = torch.empty(0, dtype=dtype)
    else:
        storage = torch.UntypedStorage._new_shared_filename_cpu(ref_counter_handle, storage_handle,
                                                               storage_size_bytes)
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = (storage_size_bytes - storage_offset_bytes) // itemsize
        payload = torch.empty(0, dtype=dtype).set_(storage, storage_offset_bytes // itemsize, (count,))
    # the device copy of the shared bytes (a host-to-device copy into a block of this process's device)
    base = wrap(torch.empty(payload.shape, dtype=dtype), index)
    base.copy_(payload)
    t = base.as_strided(tensor_size, tensor_stride, tensor_offset)
    if tensor_cls == torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _npu_reduce_tensor(tensor):
    from torch.nested._internal.nested_tensor import NestedTensor

    if tensor.is_nested and not isinstance(tensor, NestedTensor):
        return reduce_nested_tensor(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not support "
            "crossing process boundaries.  If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue).")
    torch.utils.hooks.warn_if_has_hooks(tensor)
    if tensor.device.type == "npu":
        base = torch.as_strided(tensor.detach(), (tensor.untyped_storage().nbytes() // tensor.element_size(),), (1,), 0)
        shared = base.cpu().share_memory_()      # completes the queued work, then a host copy in shared memory
        manager, handle, size = shared.untyped_storage()._share_filename_cpu_()
        shared_cache[handle] = shared.untyped_storage()
        return (rebuild_npu_tensor,
                (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(), type(tensor.untyped_storage()),
                 tensor.dtype, tensor.device.index, handle, size, 0, tensor.requires_grad, manager, 0, None, False))
    if tensor.device.type == "meta":
        return (rebuild_meta_tensor, (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(),
                                      tensor.dtype, tensor.untyped_storage().size(), tensor.requires_grad))
    metadata = (tensor.storage_offset(), tensor.size(), tensor.stride(), tensor.requires_grad)
    return (rebuild_tensor, (type(tensor), tensor._typed_storage(), metadata))


def _npu_reduce_storage(storage):
    if storage.device.type == "npu":
        raise RuntimeError("Cannot pickle NPU storage; try pickling a NPU tensor instead")
    from torch.multiprocessing import reductions

    return reductions._reduce_storage_original(storage) if hasattr(reductions, "_reduce_storage_original") \
        else reductions.reduce_storage(storage)


def _add_reductions_methods():
    """What ``import torch_npu`` does in torch_npu: NPU tensors and events pickle through these."""
    from torch.multiprocessing import reductions

    multiprocessing.reduction.register(torch.npu.Event, _npu_reduce_event)
    reductions.reduce_event = _npu_reduce_event
    reductions.reduce_tensor = _npu_reduce_tensor
    reductions.init_reductions()
