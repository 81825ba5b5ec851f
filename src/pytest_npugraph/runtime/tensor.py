"""``NpuTensor``: a tensor whose device is ``npu:N`` and whose data is a CPU payload.

Every aten or custom op on NPU tensors passes through ``__torch_dispatch__``: it runs the op
on the CPU payloads and records a task on the current stream of the tensors' device, with
the simulated bytes it reads and writes (from the op schema's alias information, as
PyTorch's CUDA sanitizer classifies arguments) and the user's source line.
"""
from __future__ import annotations

import sys
import weakref
from _weakref import _remove_dead_weakref

import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_map

from .. import trace as T
from . import cpu_gaps, profiles, user_kernels
from .callsite import user_site
from .outside_dynamo import outside_dynamo
from .._context import CONTEXT
from .runtime import current
from .device_index import device_index

NPU = "npu"
# CPU payload storage address -> weak reference to the Block over it (NPU tensors over one storage share
# one block); an entry goes when its Block dies
_storage_blocks: dict = {}


def block_of_storage(address: int):
    """The live Block over the payload storage at ``address``, or None."""
    ref = _storage_blocks.get(address)
    return None if ref is None else ref()


def _remember_block(address: int, block) -> None:
    """A weak reference without a callback (one per op: a callback costs a Python call at every death);
    dead entries are swept once the table has doubled since the last sweep, each removed only if still
    dead (``_remove_dead_weakref`` is atomic: another thread may have put a live block there meanwhile)."""
    global _sweep_at
    _storage_blocks[address] = _ref(block)
    if len(_storage_blocks) >= _sweep_at:
        for key in list(_storage_blocks):
            _remove_dead_weakref(_storage_blocks, key)
        _sweep_at = max(_SWEEP_MIN, 2 * len(_storage_blocks))


_ref = weakref.ref
_SWEEP_MIN = 4096
_sweep_at = _SWEEP_MIN


_Tensor = torch.Tensor
_make_wrapper = torch.Tensor._make_wrapper_subclass
_CPU = torch.device("cpu")


def _is_fake(t: torch.Tensor) -> bool:
    if type(t) is _Tensor:
        return t.is_meta
    return t.device.type == "meta" or type(t).__name__ in ("FakeTensor", "FunctionalTensor")


_npu_devices: dict = {}


def npu_device(index: int) -> torch.device:
    """``torch.device("npu", index)``, made once per index (every NPU tensor names one)."""
    found = _npu_devices.get(index)
    if found is None:
        found = _npu_devices[index] = torch.device(NPU, index)
    return found


class _DeviceIndex:
    """``t._dev``: the device index, kept in the tensor's ``__dict__`` when it is made (reading
    ``t.device`` builds a ``torch.device`` each time); computed for tensors made some other way."""

    def __get__(self, t, owner=None):
        return self if t is None else t.device.index


class NpuTensor(torch.Tensor):
    """An emulated NPU tensor (see the module docstring)."""

    _payload: torch.Tensor
    _block: object
    _graph_call = None   # the GraphCall when this handle is a graph call's output (see note_output_reads)
    _dev = _DeviceIndex()

    @staticmethod
    def __new__(cls, payload: torch.Tensor, device_index: int, block=None):
        if payload.storage_offset() or payload.requires_grad or payload.layout is not torch.strided:
            t = torch.Tensor._make_wrapper_subclass(
                cls, payload.size(), strides=payload.stride(), storage_offset=payload.storage_offset(),
                dtype=payload.dtype, layout=payload.layout, device=npu_device(device_index),
                requires_grad=payload.requires_grad)
        else:       # most op outputs: the keywords left out are at their defaults (parsing them costs 0.45 us)
            t = _make_wrapper(cls, payload.size(), payload.stride(), dtype=payload.dtype,
                              device=npu_device(device_index))
        state = t.__dict__          # not through __setattr__ (below): this runs on every op
        state["_payload"] = payload
        state["_block"] = block
        state["_dev"] = device_index
        return t

    # -- traceable-subclass protocol, so torch.compile sees through NPU tensors
    def __tensor_flatten__(self):
        return ["_payload"], self.device.index

    @staticmethod
    def __tensor_unflatten__(inner, device_index, outer_size, outer_stride):
        payload = inner["_payload"]
        if type(payload).__name__ == "FakeTensor":
            # while tracing, an NPU tensor is a plain FakeTensor on "npu" (as with the real torch_npu):
            # graphs then hold npu tensors, and the compiled graph is called with the NpuTensors
            return _fake_on_npu(payload, device_index)
        return wrap(payload, device_index)

    def __repr__(self, *, tensor_contents=None):
        rt = current()
        read_to_host(rt, self, "aten::_to_copy (print)")
        text = repr(self._payload.detach())
        suffix = f"device='{self.device}'"
        head, sep, tail = text.rpartition(", dtype=")
        if sep:
            return f"{head}, {suffix}{sep}{tail}"
        return f"{text[:-1]}, {suffix})"

    def tolist(self):
        """A device-to-host read, then the values (torch refuses ``tolist`` on subclasses)."""
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False):
        if not force:
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
                            "the tensor to host memory first.")
        return self.cpu().numpy(force=True)

    def data_ptr(self) -> int:
        """The simulated device address of the first element (what real code compares)."""
        block = self._block
        if block is None:
            return 0
        return block.lo + self._payload.storage_offset() * self._payload.element_size()

    def __setattr__(self, name, value):
        """``t.data = other`` (weight loading, ``Module.half()``/``.to(dtype)``): torch swaps the
        wrapper's metadata; the values are the payload's, so take ``other``'s payload and block too."""
        super().__setattr__(name, value)
        if name == "data" and isinstance(value, NpuTensor):
            state = self.__dict__
            state.pop("_span_memo", None)
            state["_payload"] = value._payload
            state["_block"] = value._block
            state["_graph_call"] = value._graph_call
            state["_dev"] = value._dev

    def untyped_storage(self):
        """The block's storage (``runtime.storage.NpuStorage``): ``data_ptr()`` is the device address."""
        from . import storage

        found = storage.untyped_storage(self)
        return torch.Tensor.untyped_storage(self) if found is None else found

    def _typed_storage(self):
        """``t.storage()``: ``runtime.storage.NpuTypedStorage``, a TypedStorage over the payload's storage
        whose ``data_ptr()`` is the device address and whose values are read from the device."""
        from . import storage

        found = storage.typed_storage(self)
        if found is None:
            return torch.TypedStorage(wrap_storage=torch.Tensor.untyped_storage(self), dtype=self.dtype,
                                      _internal=True)
        return found

    def set_(self, *args, **kwargs):
        """``t.set_(storage, ...)`` also takes what ``untyped_storage()`` returns (``NpuStorage``, which
        torch's argument parser does not know): its payload storage is the storage set."""
        from .storage import NpuStorage

        if any(isinstance(a, NpuStorage) for a in args) or isinstance(kwargs.get("source"), NpuStorage):
            args = tuple(a._payload_storage if isinstance(a, NpuStorage) else a for a in args)
            if isinstance(kwargs.get("source"), NpuStorage):
                kwargs = dict(kwargs, source=kwargs["source"]._payload_storage)
        return torch.Tensor.set_(self, *args, **kwargs)

    def __deepcopy__(self, memo):
        from . import serialization

        return serialization.deepcopy(self, memo)

    def __reduce_ex__(self, proto):
        from . import serialization

        return serialization.reduce(self, proto)

    @classmethod
    @outside_dynamo
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        ours = _ours.get(types)
        if ours is None:
            ours = _ours[types] = all(issubclass(t, NpuTensor) or t is torch.Tensor for t in types)
        if not ours:
            return NotImplemented
        fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        if fake_mode is not None:
            return _under_fake_mode(fake_mode, func, args, kwargs or {})
        return dispatch(func, args, kwargs or {})

    def _is_view(self):
        """While Dynamo fakes a compiled function's inputs, an NPU view is described by its payload
        (itself a view of the base's payload, so the fakes still share storage): torch would
        otherwise replay the view on a subclass fake, and an NPU tensor's fake is a plain
        FakeTensor on ``npu`` (see ``__tensor_unflatten__``)."""
        if _faking_inputs():
            return False
        return torch.Tensor._is_view(self)


_ours: dict = {}    # the ``types`` tuples __torch_dispatch__ was given -> whether they are all ours


def _faking_inputs() -> bool:
    guards = sys.modules.get("torch._guards")
    return guards is not None and guards.TracingContext.try_get() is not None


def _under_fake_mode(mode, func, args, kwargs):
    """An op on real NPU tensors while a FakeTensorMode traces (FakeTensorMode declines subclasses it
    does not know).  ``torch.tensor(data, device="npu")`` lifts its data on the host (see
    ``backend.install``); in a thread where torch still lifts the device copy, lift the host payload
    and copy it to the device, the graph ``torch.tensor`` makes for any device absent at trace time.
    Any other op runs on the tensors' fakes."""
    if func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
        (t,) = args
        with no_dispatch():
            host = t._payload.detach().clone()
        with mode:
            return func(host).to(t.device)

    def fake(x):
        return mode.from_tensor(x, static_shapes=True) if isinstance(x, NpuTensor) else x
    with mode:
        return func(*tree_map(fake, args), **tree_map(fake, kwargs))


def _fake_on_npu(payload, device_index):
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    with in_kernel_invocation_manager(payload.fake_mode):   # lets the fake stand for its meta tensor
        return FakeTensor(payload.fake_mode, payload, torch.device(NPU, device_index))


# ---------------------------------------------------------------------- blocks
def wrap(payload: torch.Tensor, device_index: int, stream=None, site=None) -> NpuTensor:
    """An NPU tensor over ``payload``, sharing the block of any NPU tensor on the same storage."""
    return _wrap(payload, device_index, stream, site, None)


def _wrap(payload, device_index, stream, site, fresh) -> NpuTensor:
    """``wrap``; a tensor for which a block was allocated now is appended to ``fresh`` (if a list)."""
    if _is_fake(payload):
        return NpuTensor(payload, device_index)
    if payload.layout is not _STRIDED:
        _dense_only(payload)
    storage = payload.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes == 0:
        t = NpuTensor(payload, device_index)
        if fresh is not None:
            fresh.append(t)
        return t
    key = storage.data_ptr()
    ref = _storage_blocks.get(key)
    block = None if ref is None else ref()
    if block is not None:
        return NpuTensor(payload, device_index, block)
    rt = current()
    if stream is None:
        stream = rt.current_stream(device_index)
    capture = stream.capture
    block = rt.devices[device_index].allocator.malloc(
        nbytes, stream.sid, pool=capture.pool if capture is not None else None)
    _remember_block(key, block)
    rt.on_alloc(block, site, pool=str(capture.pool) if capture is not None else None)
    t = NpuTensor(payload, device_index, block)
    if fresh is not None:
        fresh.append(t)
    return t


_STRIDED = torch.strided


def _dense_only(payload) -> None:
    if payload.layout is not torch.strided:
        raise NotImplementedError(
            f"{payload.layout} tensors are not supported on npu: torch_npu has no sparse kernels, and the emulated "
            f"NPU keeps dense tensors only. Make the {payload.layout} tensor on the host (x.cpu().to_sparse()).")


def span(t: NpuTensor):
    """The simulated bytes ``t`` covers (its elements, for a strided view), or None for an empty or
    block-less tensor."""
    row = span_row(t)
    return None if row is None else _Span(*row)


def span_row(t: NpuTensor):
    """``span(t)`` as a span row (``Span.row``), or None; what tasks are logged with.  Kept on the
    tensor: its payload's layout changes only through ``t.data = ...`` (``NpuTensor.__setattr__`` forgets it)."""
    memo = t.__dict__.get("_span_memo", _NO_SPAN)
    if memo is not _NO_SPAN:
        return memo
    block = t._block
    p = t._payload
    n = p.numel()
    if block is None or n == 0:
        memo = None
    else:
        size = p.element_size()
        lo = block.lo + p.storage_offset() * size
        if p.is_contiguous():       # most op outputs: dense bytes, no layout to work out
            memo = (block.device, lo, lo + n * size, block.bid)
        else:
            memo = _Span.row_of_view(block.device, block.bid, lo, size, p.shape, p.stride())
    t.__dict__["_span_memo"] = memo
    return memo


_NO_SPAN = object()
_Span = T.Span


# -------------------------------------------------------------------- dispatch
class _Plan:
    """What dispatch needs to know about an op, computed once per OpOverload."""

    __slots__ = ("name", "args", "reads_data", "metadata_only", "metadata_inplace", "special", "returns_args",
                 "returns_written", "writes_at", "writes_kw", "host_check", "view_of_first")

    def __init__(self, func):
        schema = func._schema
        self.name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        views = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns) \
            or schema.name in _UNANNOTATED_VIEWS
        # ``zeros_like(x)`` reads only ``x``'s metadata, but fills its result: a task (and a replay step)
        self.reads_data = not (views or _FACTORY_LIKE(schema.name))
        self.metadata_only = views or schema.name in _ALLOCATE_ONLY     # no device task at all
        self.metadata_inplace = schema.name in METADATA_INPLACE
        self.args = [(i, a.name, a.kwarg_only, bool(a.alias_info and a.alias_info.is_write))
                     for i, a in enumerate(schema.arguments)]
        self.special = _SPECIAL.get(schema.name) or _SPECIAL_NAMESPACES.get(schema.name.split("::", 1)[0], _npu_key_or_run)
        # in-place and out= ops return the very tensor object they wrote to
        # (a tensor-list argument such as ``_foreach_add_``'s ``Tensor(a!)[]`` has an empty alias set)
        written = {next(iter(a.alias_info.before_set)): i for i, a in enumerate(schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write and a.alias_info.before_set}
        self.returns_args = [written.get(next(iter(r.alias_info.before_set), None)) if r.alias_info else None
                             for r in schema.returns]
        self.returns_written = any(i is not None for i in self.returns_args)
        # per positional argument and per keyword: whether the op writes it
        self.writes_at = tuple(is_write for _, _, _, is_write in self.args)
        self.writes_kw = {name: is_write for _, name, _, is_write in self.args}
        # an aten op refuses CPU operands (but 0-dim scalars and the index ops' indices)
        self.host_check = schema.name.startswith("aten::") and schema.name not in _HOST_OPERANDS_OK
        # a view of its first argument, its only tensor (``view``, ``t``, ``expand``, ``split``...)
        self.view_of_first = views and self.special is None and \
            [i for i, a in enumerate(schema.arguments) if "Tensor" in str(a.type)] == [0] and \
            all(str(r.type) in ("Tensor", "List[Tensor]") for r in schema.returns) and len(schema.returns) == 1


# In-place ops that change only a tensor's sizes, strides or offset (or ask a type question): no kernel
# runs for them on the device.  ``resize_`` launches work only when it must grow the storage (a new block).
METADATA_INPLACE = frozenset((
    "aten::unsqueeze_", "aten::squeeze_", "aten::t_", "aten::transpose_", "aten::swapdims_",
    "aten::swapaxes_", "aten::as_strided_", "aten::detach_", "aten::resize_", "aten::resize_as_",
    "aten::_has_compatible_shallow_copy_type"))


def _FACTORY_LIKE(name: str) -> bool:
    base = name.split("::")[-1]
    return base.startswith("new_") or base.endswith("_like")


# views whose schema does not say so (``_unsafe_view(Tensor self, SymInt[] size) -> Tensor``: matmul,
# einsum and reshape's copies return one): no kernel, as for the annotated views
_UNANNOTATED_VIEWS = frozenset(("aten::_unsafe_view",))

# factories that only allocate (their values are whatever the memory held): no kernel
_ALLOCATE_ONLY = frozenset(("aten::empty_like", "aten::new_empty", "aten::new_empty_strided"))


_plans: dict = {}


def _npu_tensors(value):
    if isinstance(value, NpuTensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, NpuTensor):
                yield v


def _map(fn, value):
    """``tree_map`` for what the dispatcher passes and kernels return (tensors and scalars, in
    lists, tuples and the kwargs dict), without pytree's per-node registry lookups: it runs twice
    on every op."""
    kind = type(value)
    if kind is tuple or kind is list:
        return kind([_map(fn, v) for v in value])
    if kind is dict:
        return {k: _map(fn, v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):      # namedtuples, return types: pytree knows their layout
        return tree_map(fn, value)
    return fn(value)


def _unwrap(x):
    if isinstance(x, NpuTensor):
        return x._payload
    if isinstance(x, torch.device) and x.type == NPU:
        return torch.device("cpu")
    return x


_HOST_OPERANDS_OK = ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_")


def _host_operand(v) -> bool:
    """A CPU tensor an aten op may not mix with NPU ones (0-dim scalars may be mixed)."""
    return (isinstance(v, torch.Tensor) and not isinstance(v, NpuTensor) and v.device.type == "cpu"
            and v.dim() > 0 and not _is_fake(v))


class _Operands:
    """One pass over an op's arguments: the NPU tensors it reads, writes and takes, the arguments with
    payloads for tensors (and ``cpu`` for an ``npu`` device), whether a payload is a fake, and whether a
    host tensor is mixed in (an error for most aten ops)."""

    __slots__ = ("reads", "writes", "inputs", "fake", "host")

    def __init__(self):
        self.reads, self.writes, self.inputs = [], [], []
        self.fake = self.host = False

    def take(self, v, write, reads_data, check):
        """``v``'s unwrapped form; an NPU tensor is noted as read (``reads_data``) or written (``write``;
        None: taken only)."""
        if isinstance(v, NpuTensor):
            self.inputs.append(v)
            if write:
                self.writes.append(v)
            elif reads_data and write is not None:
                self.reads.append(v)
            p = v._payload
            if type(p) is not _Tensor and _is_fake(p):
                self.fake = True
            return p
        kind = type(v)
        if kind is list or kind is tuple:
            return kind([self.take(x, write, reads_data, check) for x in v])
        if isinstance(v, (list, tuple)):     # namedtuples, return types: pytree knows their layout
            return tree_map(lambda x: self.take(x, write, reads_data, check), v)
        if isinstance(v, torch.device):
            return _CPU if v.type == NPU else v
        if check and isinstance(v, torch.Tensor) and _host_operand(v):
            self.host = True
        return v


_PLAIN = frozenset((int, float, bool, type(None), str, torch.dtype, torch.memory_format, torch.layout))


def _same_device(inputs) -> int:
    index = inputs[0]._dev
    for t in inputs:
        if t._dev != index:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                               f"devices, npu:{index} and npu:{t._dev}!")
    return index


def dispatch(func, args, kwargs):
    plan = _plans.get(func)
    if plan is None:
        plan = _plans[func] = _Plan(func)
    if plan.special is not None:
        return plan.special(func, plan, args, kwargs)
    if plan.view_of_first:
        base = args[0]
        payload = base._payload
        if type(payload) is _Tensor and not payload.is_meta:
            return _view(func, base, payload, args, kwargs)
    return _run(func, plan, args, kwargs)


def _view(func, base: NpuTensor, payload, args, kwargs):
    """A view of ``base`` (its op's only tensor): the result shares its block, and nothing runs on the
    device (``_run`` does the same for views in general, with more to find out first)."""
    out = func(payload, *args[1:], **kwargs)
    index, block, call = base._dev, base._block, base._graph_call
    if type(out) is _Tensor:
        t = NpuTensor(out, index, block)
        if call is not None:
            t._graph_call = call
        return t
    outs = [NpuTensor(x, index, block) for x in out]
    if call is not None:
        for t in outs:
            t._graph_call = call
    return outs


def _run(func, plan, args, kwargs, now=False):
    """Run an op on the payloads and record it as a task (the common path).  When its stream has
    work queued (executor.py), the op computes its outputs' shapes now and its values when its
    turn comes (``now``: the host needs the values at once, so it first waits for the stream)."""
    ops = _Operands()
    reads_data, check, writes_at = plan.reads_data, plan.host_check, plan.writes_at
    inputs, reads, writes = ops.inputs, ops.reads, ops.writes
    uargs = []
    for v, write in zip(args, writes_at):     # the schema has every positional argument
        if type(v) is NpuTensor:              # ``take``'s common case, inline
            inputs.append(v)
            if write:
                writes.append(v)
            elif reads_data:
                reads.append(v)
            p = v._payload
            if type(p) is not _Tensor and _is_fake(p):
                ops.fake = True
            uargs.append(p)
        elif type(v) in _PLAIN:
            uargs.append(v)
        else:
            uargs.append(ops.take(v, write, reads_data, check))
    ukwargs = {name: ops.take(v, plan.writes_kw.get(name), reads_data, check) for name, v in kwargs.items()} \
        if kwargs else kwargs
    if ops.fake:
        return _wrap_outputs(func(*uargs, **ukwargs), inputs[0]._dev, None)
    rt = current()
    if inputs:
        device = _same_device(inputs)
        if ops.host:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                               f"devices, npu:{device} and cpu!")
        if not reads_data and ukwargs and "device" in kwargs:   # ``zeros_like(x, device="npu:1")``
            target = kwargs["device"]
            if type(target) is torch.device and target.type == NPU:
                device = device_index(target)
    else:
        device = device_index(None)
    state = rt.thread()
    # once per op: its allocations, task and queue entry share it (a view records nothing: none).  At
    # least three frames of ours lie between _run and the user (dispatch or a special op,
    # __torch_dispatch__ or copy_from_kernel, the outside_dynamo wrapper): the search starts at the third
    site = state.site or (None if plan.metadata_only else user_site(3))
    stream = state.streams.get(device) or rt.device(device).default_stream
    capture = stream.capture
    if capture is not None and writes and not plan.metadata_inplace:
        capture.preserve(writes)     # a capture executes nothing: undo its writes to older memory
    deferred = None
    if capture is None and not (plan.metadata_only or plan.metadata_inplace) and rt.executor.deferred(stream.sid):
        if now:
            rt.host_wait(rt.synced("stream", stream=stream), f"the host (reading the result of {plan.name})")
            kernel, out = _compute(func, uargs, ukwargs)
        else:
            kernel, out, deferred = _issue_later(rt, stream, func, uargs, ukwargs, writes)
    else:
        kernel, out = _compute(func, uargs, ukwargs)
    if writes:
        before = [t._block for t in writes]
        for t in writes:
            _sync_metadata(t)
        if plan.metadata_inplace:   # only a storage that had to grow (a new block) is device work
            writes = [t for t, block in zip(writes, before) if t._block is not block]
            reads = []
    fresh: list = []
    result = _wrap_outputs(out, device, fresh, site, stream)
    if plan.returns_written:
        result = _return_written(plan, args, kwargs, result)
    if plan.metadata_only or (plan.metadata_inplace and not writes):
        _inherit_graph_call(inputs, result)
        return result
    seq = _launch(plan.name, device, reads, writes + fresh if fresh else writes, stream=stream,
                  replay=(kernel, uargs, ukwargs, out), site=site, rt=rt)
    if deferred is not None:
        rt.executor.submit(stream.sid, seq, deferred, what=f"{plan.name} at {site}")
    return result


def _compute(func, uargs, ukwargs):
    """``(kernel, out)``: run the op on the payloads; a dtype the NPU kernel has and the CPU one
    lacks is widened (cpu_gaps), and ``kernel`` is what computed it (replays use the same)."""
    try:
        return func, func(*uargs, **ukwargs)
    except RuntimeError as error:
        gap = cpu_gaps.gap_dtype(func, error)
        if gap is None:
            raise
        kernel = cpu_gaps.widened(func, gap)
        return kernel, kernel(*uargs, **ukwargs)


def _poison(out, args, kwargs) -> None:
    """Under ``--npu-schedule=shuffle``: fresh floating outputs hold NaN until their op runs, as
    memory a device has not written yet holds garbage (a read racing with the op sees it)."""
    known = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.untyped_storage().data_ptr() not in known:
            t.fill_(float("nan"))


def _restore(saved) -> None:
    """Undo an early run's writes (a storage the op had to grow keeps its new, unwritten bytes)."""
    for storage, copy in saved:
        if storage.nbytes() == copy.nbytes():
            storage.copy_(copy)


def _issue_later(rt, stream, func, uargs, ukwargs, writes):
    """Compute ``func``'s outputs now for their shapes (inputs may not hold their values yet; its
    writes to existing memory are undone) and return them with the step that computes the values
    into them when the stream gets there.  If the early run fails on not-yet-computed inputs, the
    host waits for the stream instead (then the values are right at once)."""
    saved = [(s, s.clone()) for s in {id(t._payload.untyped_storage()): t._payload.untyped_storage()
                                     for t in writes}.values()]
    try:
        kernel, out = _compute(func, uargs, ukwargs)
    except Exception:  # noqa: BLE001 - stale inputs (indices, sizes): compute it for real instead
        _restore(saved)
        rt.host_wait(rt.synced("stream", stream=stream), "the host (an op whose inputs are not computed yet)")
        return (*_compute(func, uargs, ukwargs), None)
    _restore(saved)
    if rt.executor.shuffle is not None:
        _poison(out, uargs, ukwargs)
    from .graphs import replay_step

    fn, a, kw, dst = replay_step(kernel, uargs, ukwargs, out)

    def run():
        result = fn(*a, **kw)
        if dst is not None:
            for d, r in zip(dst, result if isinstance(result, (tuple, list)) else (result,)):
                if d is not None and d is not r:
                    d.copy_(r)
    return kernel, out, run


def _sync_metadata(t: NpuTensor) -> None:
    """Make ``t`` match its payload after an op resized or restrided it in place (``out=``
    ops such as ``arange.out``, ``resize_``, in-place view ops); a grown storage is a new block."""
    p = t._payload
    if t.shape == p.shape and t.stride() == p.stride() and t.storage_offset() == p.storage_offset():
        return
    t.data = wrap(p, t.device.index)     # takes the new block too (NpuTensor.__setattr__)


def _return_written(plan, args, kwargs, result):
    def arg(i):
        _, name, kwarg_only, _ = plan.args[i]
        return kwargs[name] if kwarg_only or i >= len(args) else args[i]
    if not isinstance(result, tuple):
        return arg(plan.returns_args[0])
    return tuple(r if i is None else arg(i) for r, i in zip(result, plan.returns_args))


def _wrap_outputs(out, device, fresh, site=None, stream=None):
    """The op's payload results as NPU tensors; those given a new block are appended to ``fresh``
    (None: the results of a fake run, never new device memory)."""
    if type(out) is _Tensor:     # most ops
        return _wrap(out, device, stream, site, fresh)

    def wrap_one(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, NpuTensor):
            return _wrap(x, device, stream, site, fresh)
        return x
    return _map(wrap_one, out)


def _launch(op: str, device: int, reads, writes, stream=None, replay=None, site=None, rt=None):
    """Record the task, or add it to the graph being captured on the stream (``replay``: the
    OpOverload, its payload arguments and its payload result, which a replay recomputes)."""
    if rt is None:
        rt = current()
    if stream is None:
        stream = rt.current_stream(device)
    read_spans, write_spans = _spans(rt, reads), _spans(rt, writes)
    site = site or rt.site_hint() or user_site(3)
    if stream.capture is not None:
        stream.capture.add(op, read_spans, write_spans, stream, replay=replay, site=site)
        return None
    for t in reads + writes if reads else writes:
        if t._graph_call is not None:
            note_output_reads(rt, reads + writes, site)
            break
    return rt.kernel_now(stream, op, read_spans, write_spans, profiles.resolve(op, rt.devices[device]), site)


def _spans(rt, tensors) -> tuple:
    """The span rows of ``tensors`` (naming in ``rt``'s trace any block an earlier test's runtime made)."""
    out = []
    for t in tensors:
        s = t.__dict__.get("_span_memo", _NO_SPAN)
        if s is _NO_SPAN:
            s = span_row(t)
        if s is not None:
            out.append(s)
            if t._block.allocator.runtime is not rt:
                rt.known_block(t._block)
    return tuple(out)


def note_output_reads(rt, tensors, site) -> None:
    """Name each use of a graph call's output handle in the trace, just before the task using it:
    ``GraphOutputRead(call, span)``.  A replay returns
    handles onto the same static buffers every call, so only the handle tells which call's output a
    task reads (the output-overwrite analysis)."""
    for t in tensors:
        call = t._graph_call
        if call is not None:
            s = span(t)
            if s is not None:
                rt.marker(T.GraphOutputRead, rt.current_stream(t.device.index), call=call, span=s, site=site)


def _inherit_graph_call(inputs, result) -> None:
    """Views of a graph call's output handle are handles of that call's output too."""
    tagged = {id(t._block): t._graph_call for t in inputs if t._graph_call is not None}
    if tagged:
        for t in _npu_tensors(result if isinstance(result, (list, tuple)) else (result,)):
            if id(t._block) in tagged:
                t._graph_call = tagged[id(t._block)]


def read_to_host(rt, t: NpuTensor, op: str) -> None:
    """A blocking device-to-host read: a copy task, then the host waits for the stream (refused while
    the stream captures a graph: ``Runtime.refuse_sync_in_capture``)."""
    stream = rt.current_stream(t.device.index)
    rt.refuse_sync_in_capture("read", t.device.index, stream, call=op)
    s = span(t)
    note_output_reads(rt, (t,), user_site(3))
    rt.kernel(stream, op, [s] if s else [], [], cores=profiles.COPY, site=user_site(3))
    rt.host_sync("read", device=t.device.index, stream=stream, site=user_site(3))


# ---------------------------------------------------------------- special ops
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


def _plan(func) -> _Plan:
    plan = _plans.get(func)
    if plan is None:
        plan = _plans[func] = _Plan(func)
    return plan


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
    for key in _HOST_KERNEL_KEYS:
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key):
            return func._op_dk(getattr(torch._C.DispatchKey, key), *args, **kwargs)
    return _run(func, plan, args, kwargs)


def _npu_key_or_run(func, plan, args, kwargs):
    """An op outside aten: a kernel user code registered for the npu key (``user_kernels``) runs with
    the NPU tensors themselves, as on hardware, so the ops it calls are dispatched, recorded and
    checked like any others; any other op runs on the payloads (its CPU kernel)."""
    if user_kernels.has_user_kernel(plan.name):
        return func._op_dk(_PRIVATEUSE1, *args, **kwargs)
    return _run(func, plan, args, kwargs)


_PRIVATEUSE1 = torch._C.DispatchKey.PrivateUse1
# namespaces whose ops never have a user's npu-key kernel (None: the common path)
_SPECIAL_NAMESPACES = {"aten": None, "prims": None, "air": _host_op}


_SPECIAL = {
    "aten::record_stream": _record_stream,
    "aten::_to_copy": _to_copy,
    "aten::copy_": _copy,
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
