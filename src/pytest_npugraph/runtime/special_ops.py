"""Special ops, handlers of the dispatch core (``tensor.register_op_handler``): ops whose result the
host must wait for (``_local_scalar_dense``, data-dependent shapes), ``set_``, ``record_stream``,
torchair's control ops (``air::``), and ops with a kernel user code registered for the npu key.
"""
from __future__ import annotations

import torch

from . import user_kernels
from .callsite import user_site
from .runtime import current
from .tensor import (NpuTensor, _is_fake, _map, _npu_tensors, _run, _same_device, _unwrap, register_op_handler,
                     wrap)


def _record_stream(func, plan, args, kwargs):
    t, stream = args[0], args[1]
    rt = current()
    if t._block is None:
        return None
    state = rt.stream_by_id(stream.device_index, stream.stream_id)
    if state.external:
        from .errors import ErrCode, pta_error

        raise RuntimeError("External NPU stream is not supported in record_stream. This path requires a "
                           "torch_npu-managed stream." + pta_error(ErrCode.NOT_SUPPORT))
    if t._block.allocator.runtime is not rt:
        rt.known_block(t._block)
    rt.record_stream(t._block, state)
    return None


def _host_read(func, plan, args, kwargs):
    """Ops whose result (a scalar or a data-dependent shape) the host must wait for (refused while the
    stream captures a graph: ``Runtime.refuse_sync_in_capture``)."""
    inputs = [t for v in args for t in _npu_tensors(v)]
    stream = None
    if inputs and not _is_fake(inputs[0]._payload):
        rt = current()
        device = inputs[0]._dev
        stream = rt.current_stream(device)
        rt.refuse_sync_in_capture("read", device, stream, call=plan.name)
    result = _run(func, plan, args, kwargs, now=True)
    if stream is not None:
        rt.host_sync("read", device=device, stream=stream, site=user_site(2))
    return result


def _set(func, plan, args, kwargs):
    """``aten::set_``: a metadata change (no device task): ``self``'s payload is pointed at the source's
    storage (the payload storage, from a tensor or a storage), and ``self`` takes the block over it."""
    t = args[0]
    if not isinstance(t, NpuTensor) or _is_fake(t._payload):
        return _run(func, plan, args, kwargs)
    source = args[1] if len(args) > 1 else kwargs.get("source")
    if isinstance(source, NpuTensor):
        _same_device([t, source])
    elif isinstance(source, torch.Tensor):
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{t.device} and {source.device}!")
    func(*_map(_unwrap, tuple(args)), **_map(_unwrap, kwargs))
    t.data = wrap(t._payload, t._dev)       # the block over the payload's (new) storage
    return t


_MASK_DTYPES = (torch.bool, torch.uint8)


def _mask_index(args, kwargs) -> bool:
    """An index list (``index``, ``index_put(_)``) holding a boolean (or uint8) mask on the device: its
    count of true values, which the host needs for the result's shape, is a device value (the real
    kernel calls ``nonzero``)."""
    if len(args) > 1 and args[1]:
        for i in args[1]:
            if isinstance(i, NpuTensor) and i.dtype in _MASK_DTYPES:
                return True
    return False


def _host_read_if(needs_host):
    """An op that reads a device value to the host only in some calls (``needs_host(args, kwargs)``)."""
    def op(func, plan, args, kwargs):
        if needs_host(args, kwargs):
            return _host_read(func, plan, args, kwargs)
        return _run(func, plan, args, kwargs)
    return op


_HOST_KERNEL_KEYS = ("PrivateUse1", "CompositeExplicitAutograd", "BackendSelect")


def _host_op(func, plan, args, kwargs):
    """torchair's control ops (``air::``: scopes, events, record_stream by tag, wait_tensor) act on
    the host and the runtime, not as device tasks: their kernel runs on the NPU tensors themselves."""
    key = _host_keys.get(func, _UNKNOWN)
    if key is _UNKNOWN:     # torchair's registrations are made once per process: ask the dispatcher once
        key = _host_keys[func] = next((getattr(torch._C.DispatchKey, k) for k in _HOST_KERNEL_KEYS
                                       if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), k)), None)
    if key is not None:
        return func._op_dk(key, *args, **kwargs)
    return _run(func, plan, args, kwargs)


_host_keys: dict = {}       # air:: OpOverload -> the dispatch key of its kernel, or None
_UNKNOWN = object()


def _print(func, plan, args, kwargs):
    """``air::print`` (``torchair.ops.npu_print``): eagerly a host op like the other ``air::`` ops.  In a
    stream that captures a graph (reduce-overhead / npugraph_ex) it is a replay step, so every replay
    prints the values of that replay, as a graph's host function would (torch_npu's own
    ``print_npugraph_tensor``); its CPU kernel prints nothing while the stream captures, where the
    buffers hold no values of any run yet."""
    tensors = args[0] if args else kwargs.get("tensors")
    first = next((t for t in tensors or () if isinstance(t, NpuTensor)), None)
    if first is not None and not _is_fake(first._payload) and current().current_stream(first._dev).capture is not None:
        return _run(func, plan, args, kwargs)
    return _host_op(func, plan, args, kwargs)


def _npu_key_or_run(func, plan, args, kwargs):
    """An op outside aten: a kernel user code registered for the npu key (``user_kernels``) runs with
    the NPU tensors themselves, as on hardware, so the ops it calls are dispatched, recorded and
    checked like any others; any other op runs on the payloads (its CPU kernel)."""
    if user_kernels.has_user_kernel(plan.name):
        return func._op_dk(_PRIVATEUSE1, *args, **kwargs)
    return _run(func, plan, args, kwargs)


_PRIVATEUSE1 = torch._C.DispatchKey.PrivateUse1


def _format_cast(func, plan, args, kwargs):
    """``npu_format_cast`` to the format its input already has returns the input itself, with no kernel,
    as torch_npu does (vLLM-Ascend's most called op relies on it); any other cast takes the npu-op path."""
    from .ops.layout import same_format_cast

    def payload(v):
        return v._payload if type(v) is NpuTensor else v
    if type(args[0]) is NpuTensor and same_format_cast([payload(a) for a in args],
                                                      {k: payload(v) for k, v in kwargs.items()}):
        return args[0]
    return _npu_key_or_run(func, plan, args, kwargs)


_HANDLERS = {
    "npu::npu_format_cast": _format_cast,
    "aten::record_stream": _record_stream,
    "aten::set_": _set,
    "aten::_local_scalar_dense": _host_read,
    "aten::nonzero": _host_read,
    "aten::masked_select": _host_read,
    "aten::_unique2": _host_read,
    "aten::unique_dim": _host_read,
    "aten::unique_consecutive": _host_read,
    "aten::equal": _host_read,
    "aten::is_nonzero": _host_read,
    # data-dependent output shapes (tests/precision/test_host_syncs.py lists every one)
    "aten::_unique": _host_read,
    "aten::bincount": _host_read,
    "aten::allclose": _host_read,
    "aten::index": _host_read_if(_mask_index),
    "aten::index_put": _host_read_if(_mask_index),
    "aten::index_put_": _host_read_if(_mask_index),
    "aten::_index_put_impl_": _host_read_if(_mask_index),
    # repeat_interleave.Tensor(repeats, *, output_size=None): the output's length is sum(repeats)
    "aten::repeat_interleave": _host_read_if(
        lambda args, kwargs: len(args) == 1 and isinstance(args[0], NpuTensor) and kwargs.get("output_size") is None),
}


def install() -> None:
    for name, handler in _HANDLERS.items():
        register_op_handler(name, handler)
    register_op_handler("aten::*", None)         # aten and prims ops never have a user's npu-key kernel
    register_op_handler("prims::*", None)
    register_op_handler("air::*", _host_op)
    register_op_handler("air::print", _print)
    register_op_handler("*", _npu_key_or_run)
