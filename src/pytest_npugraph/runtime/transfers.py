"""Host/device transfers, handlers of the dispatch core (``tensor.register_op_handler``).

``_to_copy`` and ``copy_`` between the host and a device and between two devices, ``non_blocking``
copies and the host memory they still use (``PendingHostTensor``), and the npu ``_copy_from``
kernel that ``torch.tensor(data, device="npu")`` reaches (registered by ``backend``).
"""
from __future__ import annotations

import torch

from .. import trace as T
from .._context import CONTEXT
from .callsite import user_site
from .device_index import device_index
from .outside_dynamo import outside_dynamo
from .runtime import current
from .tensor import (NPU, NpuTensor, _Plan, _is_fake, _launch, _plan, _plans, _run, dispatch, npu_device,
                     read_to_host, register_op_handler)


def _to_copy(func, plan, args, kwargs):
    src = args[0]
    target = kwargs.get("device")
    if target is not None and torch.device(target).type != NPU:
        rt = current()
        kw = dict(kwargs)
        kw.pop("non_blocking", None)
        if not _is_fake(src._payload):
            if kwargs.get("non_blocking"):
                return _copy_to_host_later(rt, plan.name, src, lambda: func(src._payload, **kw))
            read_to_host(rt, src, plan.name + " (D2H)")
        return func(src._payload, **kw)
    if target is not None:
        index = device_index(target)
        if index != src._dev and not _is_fake(src._payload):
            return _to_other_npu(src, index, kwargs)
        kwargs = dict(kwargs, device=npu_device(index))
    return _run(func, plan, args, kwargs)


def _to_other_npu(src, index: int, kwargs):
    """``_to_copy`` to another npu (``x.to("npu:1")`` of an npu:0 tensor): a tensor allocated on
    npu:index, filled by a device-to-device copy (``_copy_between_devices``)."""
    like = {k: v for k, v in kwargs.items() if k in ("dtype", "layout", "pin_memory", "memory_format")}
    dst = dispatch(torch.ops.aten.empty_like.default, (src,), dict(like, device=npu_device(index)))
    func = torch.ops.aten.copy_.default
    return _copy(func, _plan(func), (dst, src, bool(kwargs.get("non_blocking", False))), {})


def _copy_between_devices(func, plan, dst, src, non_blocking):
    """``dst.copy_(src)`` across npus, ordered as torch orders a copy between two CUDA devices
    (ATen's Copy.cu): the copy is a task on the source device's current stream, which first waits
    for the destination device's current stream (nothing else still uses ``dst``), and the
    destination's stream then waits for the copy (later work there sees its values).  Issued
    asynchronously in either case, as that copy is."""
    rt = current()
    src_stream, dst_stream = rt.current_stream(src._dev), rt.current_stream(dst._dev)
    site = user_site(3)
    ready = rt.new_event("copy destination ready")
    rt.record_event(ready, dst_stream, site)
    rt.wait_event(ready, src_stream, site)
    dst_p, src_p = dst._payload, src._payload
    capture = src_stream.capture
    if capture is not None:
        capture.preserve([dst])
    later = capture is None and rt.executor.deferred(src_stream.sid)
    if not later:
        _host_copy(dst_p, src_p)
    seq = _launch(plan.name + " (D2D)", src._dev, [src], [dst], stream=src_stream,
                  replay=(func, (dst_p, src_p), {}, dst_p), site=site, rt=rt)
    if later:
        rt.executor.submit(src_stream.sid, seq, lambda: _host_copy(dst_p, src_p), what=f"D2D copy at {site}")
    done = rt.new_event("copy done")
    rt.record_event(done, src_stream, site)
    rt.wait_event(done, dst_stream, site)
    return dst


def _copy(func, plan, args, kwargs):
    dst, src = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    if isinstance(dst, NpuTensor) and isinstance(src, NpuTensor):
        if dst._dev != src._dev and not _is_fake(dst._payload) and not _is_fake(src._payload):
            return _copy_between_devices(func, plan, dst, src, non_blocking)
        return _run(func, plan, args, kwargs)
    rt = current()
    if isinstance(dst, NpuTensor):          # host to device
        stream = None if _is_fake(dst._payload) else rt.current_stream(dst.device.index)
        capture = None if stream is None else stream.capture
        if capture is not None:
            capture.preserve([dst])
        later = stream is not None and capture is None and rt.executor.deferred(stream.sid)
        if later and not non_blocking:       # a blocking copy runs in stream order, the host waiting
            rt.host_wait(rt.synced("stream", stream=stream), f"the host (blocking copy at {user_site(2)})")
            later = rt.executor.deferred(stream.sid)
        payload = dst._payload
        if not later:
            _host_copy(payload, src)
        if stream is not None:
            seq = _launch(plan.name + " (H2D)", dst.device.index, [], [dst],
                          replay=(func, (payload, src), {}, payload))
            if later:                        # the device reads the host memory when it gets there
                rt.executor.submit(stream.sid, seq, lambda: _host_copy(payload, src),
                                   what=f"H2D copy at {user_site(2)}")
            if not non_blocking:
                rt.host_sync("stream", device=dst.device.index, stream=stream, site=user_site(2))
            elif capture is None:            # the host must not write the source before it knows the copy done
                _watch_host(src, rt, stream.sid, seq, "source")
        return dst
    if not _is_fake(src._payload):           # device to host
        if non_blocking:
            _copy_to_host_later(rt, plan.name, src, lambda: _host_copy(dst, src._payload), fresh=False)
            return dst
        read_to_host(rt, src, plan.name + " (D2H)")
    _host_copy(dst, src._payload)
    return dst


def _host_copy(dst, src):
    """The copy task's own access to host memory: not a host access (``PendingHostTensor`` ignores it)."""
    with torch._C.DisableTorchFunctionSubclass():
        return dst.copy_(src)


def _copy_to_host_later(rt, name: str, src, copy, fresh: bool = True):
    """A non_blocking device-to-host copy: a task on the stream; ``copy()`` runs when it does (at
    once if nothing is queued ahead of it).  Returns what the first ``copy()`` returned; ``fresh``:
    ``copy()`` makes a new tensor each time, whose values the queued copy puts into the first."""
    stream = rt.current_stream(src.device.index)
    seq = _launch(name + " (D2H)", src.device.index, [src], [])
    result = copy()                           # deferred: shape and dtype now, values when the copy runs
    if rt.executor.deferred(stream.sid):
        if rt.executor.shuffle is not None and isinstance(result, torch.Tensor) and result.is_floating_point():
            with torch._C.DisableTorchFunctionSubclass():
                result.fill_(float("nan"))    # not copied yet: a host read before a sync sees garbage
        if fresh:
            target = result
            rt.executor.submit(stream.sid, seq, lambda: _host_copy(target, copy()), what=f"D2H copy at {user_site(3)}")
        else:
            rt.executor.submit(stream.sid, seq, copy, what=f"D2H copy at {user_site(3)}")
    if fresh:
        return _pending_on_host(result, rt, stream.sid, seq)
    return _watch_host(result, rt, stream.sid, seq, "destination")


# the torch calls on a pending copy destination that read no values (metadata, views handled apart)
_NO_DATA = frozenset({
    "size", "shape", "dtype", "device", "dim", "ndim", "ndimension", "numel", "nelement", "stride",
    "is_contiguous", "element_size", "itemsize", "nbytes", "requires_grad", "layout", "is_floating_point",
    "is_complex", "is_pinned", "data_ptr", "storage_offset", "untyped_storage", "is_cuda", "is_cpu", "is_npu",
    "is_sparse", "is_quantized", "is_meta", "names", "grad", "grad_fn", "is_leaf", "_base", "__len__",
    "__hash__", "get_device", "__class__", "__dict__", "__setstate__",
    "_is_view", "is_shared", "__dlpack_device__", "__torch_function__",
})


# pickling and deep copies of a pending destination make plain tensors (its watch holds the runtime)
_AS_PLAIN = frozenset({"__reduce_ex__", "__reduce__", "__deepcopy__", "__getstate__"})


class PendingHostTensor(torch.Tensor):
    """Host memory a ``non_blocking`` copy task still uses: the CPU tensor a device-to-host copy
    returns (``y.to("cpu", non_blocking=True)``), and, for as long as their copy is pending, the
    user's own tensors the copy uses (``cpu_t.copy_(npu_t, non_blocking=True)``'s destination,
    ``npu_t.copy_(cpu_t, non_blocking=True)``'s source, and the tensor those are views of: their
    class is switched, and switched back once the host knows the copy done).  Each torch call that
    uses the copied bytes while the host does not know the copy done is recorded as ``HostAccess``
    (host_races.py reports those the host did not wait for): any use of a destination, writes of a
    source.  Views stay pending; results of other calls are plain tensors.  Once the host knows the
    copy done, calls cost one check."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        plain = args
        if name in _AS_PLAIN and args and isinstance(args[0], PendingHostTensor):
            plain = (args[0].as_subclass(torch.Tensor),) + tuple(args[1:])   # copies: a plain tensor
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*plain, **kwargs)
        pending = [a for a in args if isinstance(a, PendingHostTensor)]
        pending += [v for v in kwargs.values() if isinstance(v, PendingHostTensor)]
        live = [p for p in pending if p._npu_copy is not None and not _copy_known_done(p)]
        if not live:
            return result
        if name in ("__get__", "__set__"):
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        if name in _NO_DATA:
            return result
        with torch._C.DisableTorchFunctionSubclass():
            first = live[0]
            if isinstance(result, torch.Tensor) and not isinstance(result, PendingHostTensor) \
                    and result.device.type == "cpu" and result.numel() \
                    and result.untyped_storage().data_ptr() == first.untyped_storage().data_ptr():
                return _pending_on_host(result, *first._npu_copy)   # a view: pending if it holds copied bytes
            live = [p for p in live if _overlaps(_accessed(p, name, args), p._npu_copy[4])]
        out = kwargs.get("out")
        for p in live:
            rt, sid, seq, role, _ = p._npu_copy
            write = p is out or (args and p is args[0] and _writes(name))
            if role == "source" and not write:
                continue
            rt.marker(T.HostAccess, site=user_site(1), copy=seq, access="write" if write else "read", role=role,
                      op=f"{name}()" if name else str(func))
            break
        return result


# in-place calls that write their first argument without a trailing-underscore name
_IN_PLACE = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                       "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                       "__imatmul__", "set_"})


def _writes(name: str) -> bool:
    return name in _IN_PLACE or (name.endswith("_") and not name.startswith("_"))


def _extent(t) -> tuple:
    """The bytes of its storage that tensor ``t`` spans, as ``(lo, hi)``."""
    item = t.element_size()
    lo = t.storage_offset() * item
    if t.numel() == 0:
        return lo, lo
    return lo, lo + (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 1)) * item


def _overlaps(t, extent) -> bool:
    lo, hi = _extent(t)
    return lo < extent[1] and extent[0] < hi


def _accessed(t, name: str, args):
    """The part of ``t`` a call uses: the indexed part for ``t[index] = value``, else all of ``t``."""
    if name == "__setitem__" and len(args) > 1 and args[0] is t:
        try:
            part = t[args[1]]
        except Exception:   # noqa: BLE001 - the call itself already succeeded; be conservative
            return t
        if isinstance(part, torch.Tensor) and part.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            return part
    return t


def _copy_known_done(t) -> bool:
    """The host knows ``t``'s copy done (or the copy belongs to an earlier test): stop watching ``t``."""
    rt, sid, seq = t._npu_copy[:3]
    if rt.generation != CONTEXT.generation or rt.stream_completed(sid, seq):
        t._npu_copy = None
        if t.__dict__.get("_npu_switched"):          # the user's own tensor: back to what it was
            del t._npu_switched
            t.__class__ = torch.Tensor
        return True
    return False


def _pending_on_host(result, rt, sid, seq, role="destination", extent=None):
    """``result`` as a ``PendingHostTensor`` watching copy task ``seq``, which uses the bytes ``extent``
    of its storage (all of them by default); unchanged if the copy was not recorded or ``result``
    holds none of those bytes."""
    if seq is None or not isinstance(result, torch.Tensor) or result.device.type != "cpu":
        return result
    if extent is None:
        extent = _extent(result)
    elif not _overlaps(result, extent):
        return result
    out = torch.Tensor._make_subclass(PendingHostTensor, result, result.requires_grad)
    out._npu_copy = (rt, sid, seq, role, extent)
    return out


def _watch_host(t, rt, sid, seq, role):
    """The user's CPU tensor ``t`` (and the tensor it is a view of) is the ``role`` ("source" or
    "destination") of copy task ``seq``: a ``PendingHostTensor`` until the host knows the copy done.
    Tensors of other subclasses are left alone.  Returns ``t``."""
    if seq is None or not isinstance(t, torch.Tensor) or t.device.type != "cpu" or isinstance(t, NpuTensor):
        return t
    with torch._C.DisableTorchFunctionSubclass():
        extent, base = _extent(t), t._base          # a view and its base share the storage's offsets
    for owner in (t,) if base is None else (t, base):
        if isinstance(owner, PendingHostTensor) and owner.__dict__.get("_npu_copy") is not None \
                and not _copy_known_done(owner) and owner._npu_copy[3] == "destination" and role == "source":
            continue                          # a pending device write of this memory matters more than a read
        if type(owner) is torch.Tensor:
            owner.__class__ = PendingHostTensor
            owner._npu_switched = True
        if isinstance(owner, PendingHostTensor):
            owner._npu_copy = (rt, sid, seq, role, extent)
    return t


@outside_dynamo
def copy_from_kernel(src, dst, non_blocking=False):
    """``aten::_copy_from`` for the npu backend.  Reached only with the Python key excluded:
    ``torch.tensor(data, device="npu")`` builds its result that way (``empty`` + ``copy_``)."""
    func = torch.ops.aten.copy_.default
    plan = _plans.get(func)
    if plan is None:
        plan = _plans[func] = _Plan(func)
    return _copy(func, plan, (dst, src, non_blocking), {})


def install() -> None:
    register_op_handler("aten::_to_copy", _to_copy)
    register_op_handler("aten::copy_", _copy)
