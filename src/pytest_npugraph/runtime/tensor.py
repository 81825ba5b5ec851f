"""``NpuTensor``: a tensor whose device is ``npu:N`` and whose data is a CPU payload, and the dispatch core.

Every aten or custom op on NPU tensors passes through ``__torch_dispatch__``: it runs the op
on the CPU payloads and records a task on the current stream of the tensors' device, with
the simulated bytes it reads and writes (from the op schema's alias information, as
PyTorch's CUDA sanitizer classifies arguments) and the user's source line.  Ops that need more
than that common path (host/device transfers: ``transfers``; host reads, ``set_``,
``record_stream``, torchair's control ops, users' npu-key kernels: ``special_ops``) register a
handler (``register_op_handler``); this module imports neither.
"""
from __future__ import annotations

import sys
import weakref
from _weakref import _remove_dead_weakref

import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_map

from .. import trace as T
from . import aot_stream_estimate, compiled_backward, cpu_gaps, generators, profiles, wide_uints
from .callsite import user_site
from .outside_dynamo import outside_dynamo
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

    if compiled_backward._original is None:     # before AOTAutograd compiles a graph of NPU tensors
        compiled_backward.install()
    if aot_stream_estimate._original is None:   # before its stream pass estimates the graph's ops
        aot_stream_estimate.install()

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
    block = rt.devices[device_index].allocator.malloc(nbytes, stream.sid, pool=rt.allocation_pool(stream, device_index))
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
                 "returns_written", "writes_at", "writes_kw", "host_check", "view_of_first", "uints")

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
        self.special = _handler_of(schema.name)
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
        # (schema name, the wide uints its NPU kernel takes) when it lacks one (wide_uints); no kernel: None
        taken = wide_uints.taken(schema.name)
        self.uints = None if self.metadata_only or self.metadata_inplace or taken == wide_uints.WIDE \
            else (schema.name, taken)
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
    if plan.uints is not None:
        wide_uints.refuse(*plan.uints, inputs, kwargs)
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
            kernel, out = _compute(func, uargs, ukwargs, rt, device)
        else:
            kernel, out, deferred = _issue_later(rt, stream, func, uargs, ukwargs, writes, device)
    else:
        kernel, out = _compute(func, uargs, ukwargs, rt, device)
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


def _compute(func, uargs, ukwargs, rt=None, device=None):
    """``(kernel, out)``: run the op on the payloads; a dtype the NPU kernel has and the CPU one
    lacks is widened (cpu_gaps), and ``kernel`` is what computed it (replays use the same).  A random
    op on npu:``device`` draws from that device's generator (generators.py)."""
    if device is not None and generators.seeded(func):
        with generators.drawing_on(rt, device):
            return _compute(func, uargs, ukwargs)
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


def _issue_later(rt, stream, func, uargs, ukwargs, writes, device):
    """Compute ``func``'s outputs now for their shapes (inputs may not hold their values yet; its
    writes to existing memory are undone) and return them with the step that computes the values
    into them when the stream gets there.  If the early run fails on not-yet-computed inputs, the
    host waits for the stream instead (then the values are right at once)."""
    saved = [(s, s.clone()) for s in {id(t._payload.untyped_storage()): t._payload.untyped_storage()
                                     for t in writes}.values()]
    # a random op's numbers are the generator's at issue (hardware reserves them then), whenever it runs
    draws = generators.default_generator(rt, device) if generators.seeded(func) else None
    state = None if draws is None else draws.get_state()
    try:
        kernel, out = _compute(func, uargs, ukwargs, rt, device)
    except Exception:  # noqa: BLE001 - stale inputs (indices, sizes): compute it for real instead
        _restore(saved)
        if draws is not None:
            draws.set_state(state)
        rt.host_wait(rt.synced("stream", stream=stream), "the host (an op whose inputs are not computed yet)")
        return (*_compute(func, uargs, ukwargs, rt, device), None)
    _restore(saved)
    if rt.executor.shuffle is not None:
        _poison(out, uargs, ukwargs)
    from .graphs import replay_step

    fn, a, kw, dst = replay_step(kernel, uargs, ukwargs, out)

    def run():
        if state is None:
            result = fn(*a, **kw)
        else:
            with generators.drawing_from_state(state):
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


# ---------------------------------------------------------------- op handlers
def _plan(func) -> _Plan:
    """``func``'s plan (for handlers that dispatch another op themselves)."""
    plan = _plans.get(func)
    if plan is None:
        plan = _plans[func] = _Plan(func)
    return plan


_HANDLERS: dict = {}    # "ns::op" / "ns::*" / "*" -> handler(func, plan, args, kwargs), or None: the common path


def register_op_handler(name: str, handler) -> None:
    """Route op ``name`` to ``handler(func, plan, args, kwargs)`` instead of the common path (``_run``),
    as DTensor's op dispatcher takes custom op handlers: ``"aten::copy_"`` (every overload), ``"air::*"``
    (every op of a namespace), ``"*"`` (any op of a namespace not named); a ``None`` handler keeps the
    ops on the common path.  The host/device transfers (``transfers``) and the special ops
    (``special_ops``) register here when ``backend.install`` runs."""
    _HANDLERS[name] = handler
    _plans.clear()          # a plan holds the handler in force when it was made


def _handler_of(name: str):
    if name in _HANDLERS:
        return _HANDLERS[name]
    namespace = name.split("::", 1)[0] + "::*"
    return _HANDLERS[namespace] if namespace in _HANDLERS else _HANDLERS.get("*")
