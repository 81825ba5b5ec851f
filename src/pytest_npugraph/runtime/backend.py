"""Make torch know the ``npu`` device: once per process, when the emulated torch_npu is imported.

This is what ``import torch_npu`` does to torch (rename PrivateUse1 to ``npu``, register
``torch.npu``, add ``Tensor.npu``/``is_npu``/``Module.npu``), done through PyTorch's Python
backend hooks, plus the npu key's kernels: a PrivateUse1 fallback that creates NPU tensors for
factory functions, ``empty``/``empty_strided`` (the device allocator answers first) and
``_copy_from``.  It is THE torch-facing boundary: every ``torch.library`` registration for the npu
key lives here (or in a runtime module ``install`` calls), and ``device_index`` is the one place a
device argument becomes an index.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from .outside_dynamo import outside_dynamo
from .tensor import NPU, NpuTensor, _launch, _unwrap, wrap
from .runtime import current
from .device_index import device_index, with_index  # noqa: F401  (the one resolver; backend.device_index)

_installed = False
_library = None
_kernels = None


# ------------------------------------------------------------------- devices
class NpuDeviceGuard(torch._C._acc.DeviceGuard):
    """The device guard registered for PrivateUse1.  torch 2.13's Python guard forwards only ``type_``
    to Python: the C++ side answers ``getDevice`` with index 0 and ignores ``setDevice``, so where
    C++ would resolve a bare ``npu`` through the guard (``at::native::to``'s ``ensure_has_index``,
    reached by ``Tensor.to``, ``torch.tensor``/``as_tensor``/``asarray`` and ``Tensor.new_tensor``)
    the Python entry point resolves it first with ``device_index`` (``_resolve_bare_devices``)."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


_dynamo_tracing = torch.compiler.is_dynamo_compiling   # False when called; Dynamo traces it as True
_WRAPPED: dict = {}   # wrapper -> the torch function it resolves bare devices for


def _resolve_bare_devices() -> None:
    """The entry points where torch's C++ would ask the device guard for a bare npu's index resolve it
    with ``device_index`` first (the calling thread's current device, as torch_npu's guard answers).
    Compiled regions: Dynamo puts the wrappers into graphs as it puts the functions they wrap
    (``register_with_dynamo``), so a graph resolves a bare npu when it runs, in the thread running
    it, and the fake tensors made while tracing are on the tracing thread's device."""
    def on_device(original):
        def call(*args, **kwargs):        # device is keyword-only in each
            if "device" in kwargs and not _dynamo_tracing():
                kwargs["device"] = with_index(kwargs["device"])
            return original(*args, **kwargs)
        return _wrapper(call, original, original.__name__)

    def tensor_to(self, *args, **kwargs):
        if not _dynamo_tracing():
            if args:
                args = (with_index(args[0]),) + args[1:]
            if "device" in kwargs:
                kwargs["device"] = with_index(kwargs["device"])
        return to(self, *args, **kwargs)

    def tensor_new_tensor(self, data, *args, **kwargs):
        """``new_tensor`` on an npu tensor: torch names the result's device by the dispatch key alone
        (a bare npu), under a device guard set to ``self``'s device."""
        if not _dynamo_tracing():
            if kwargs.get("device") is None and type(self) is NpuTensor:
                kwargs["device"] = self.device
            elif "device" in kwargs:
                kwargs["device"] = with_index(kwargs["device"])
        return new_tensor(self, data, *args, **kwargs)

    if torch.tensor in _WRAPPED:
        return
    torch.tensor = on_device(torch.tensor)
    torch.as_tensor = on_device(torch.as_tensor)
    torch.asarray = on_device(torch.asarray)
    to, new_tensor = torch.Tensor.to, torch.Tensor.new_tensor
    torch.Tensor.to = _wrapper(tensor_to, to, "to")
    torch.Tensor.new_tensor = _wrapper(tensor_new_tensor, new_tensor, "new_tensor")


def _wrapper(fn, original, name: str):
    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, original.__doc__
    fn.__wrapped__ = original
    _WRAPPED[fn] = original
    return fn


def register_with_dynamo() -> None:
    """Dynamo treats each bare-device wrapper as the torch function it wraps (in-graph, with that
    function's special handling): called when ``torch._dynamo`` is first imported."""
    from torch._dynamo import trace_rules
    from torch._dynamo.variables import TorchInGraphFunctionVariable

    handlers = TorchInGraphFunctionVariable._get_handlers()
    rules = {}
    for fn, original in _WRAPPED.items():
        if original in handlers and fn not in handlers:
            handlers[fn] = handlers[original]
        if fn.__name__ in ("tensor", "as_tensor", "asarray"):
            rules[f"torch.{fn.__name__}"] = TorchInGraphFunctionVariable
        elif fn.__name__ in ("to", "new_tensor"):
            # under a torch function mode (``torch.set_default_device``) Dynamo calls the method
            # through the mode with the function ``torch.Tensor.<name>`` itself: in-graph, as the
            # method is, not inlined into the wrapper (whose C method it cannot trace: a graph break)
            rules[f"torch.Tensor#{fn.__name__}"] = TorchInGraphFunctionVariable
    trace_rules.torch_name_rule_map.append(rules)
    trace_rules.clear_lru_cache()


def register_with_aot_autograd() -> None:
    """A compiled backward takes NPU tensors as plain tensors (``compiled_backward``): called when
    ``torch._dynamo`` is first imported (and again when Dynamo first traces an NPU tensor, if
    AOTAutograd was still loading then), before any backward is compiled."""
    from . import aot_stream_estimate, compiled_backward

    compiled_backward.install()
    aot_stream_estimate.install()         # a stream scope in a trained graph asks the NPU's bandwidth


# ------------------------------------------------------------------- kernels
def _target_device(args, kwargs) -> int:
    for value in list(kwargs.values()) + list(args):
        if isinstance(value, torch.device) and value.type == NPU:
            return device_index(value)
    return device_index(None)


@outside_dynamo
def _privateuse1_fallback(keyset, op, *args, **kwargs):
    """Ops that reach the npu backend with no NPU tensor argument: factories (``empty``...)."""
    index = _target_device(args, kwargs)
    current().check_device(index)
    out = op(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    created = []

    def wrap_one(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, NpuTensor):
            t = wrap(x, index)
            created.append(t)
            return t
        return x

    result = tree_map(wrap_one, out)
    name = op._schema.name
    if not name.startswith("aten::empty") and created:
        _launch(name, index, [], created)
    return result


def _empty_nbytes(size, stride, dtype) -> int:
    if any(n == 0 for n in size):
        return 0
    itemsize = (dtype or torch.get_default_dtype()).itemsize
    if stride is None:
        count = 1
        for n in size:
            count *= n
        return count * itemsize
    return (sum((n - 1) * abs(st) for n, st in zip(size, stride)) + 1) * itemsize


def _npu_empty(op):
    """The npu kernel of ``empty``/``empty_strided``: the device allocator answers (or raises
    ``OutOfMemoryError``) before the CPU payload is made, so a huge request fails as on an NPU."""
    strided = op is torch.ops.aten.empty_strided.default

    def kernel(*args, **kwargs):
        index = device_index(kwargs.get("device"))
        rt = current()
        rt.check_device(index)
        rt.devices[index].initialized = True     # an allocation, even one that fails, lazily initialises
        rt.check_allocation(index, _empty_nbytes(args[0], args[1] if strided else None, kwargs.get("dtype")))
        return wrap(op(*args, **dict(kwargs, device=torch.device("cpu"))), index)
    return outside_dynamo(kernel)


def _register_kernels() -> None:
    """npu kernels the Python-key path cannot provide (once per process, like the C++ ones)."""
    global _kernels
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_copy_from", "PrivateUse1"):
        return
    from . import transfers

    _kernels = torch.library.Library("aten", "IMPL")
    # torch.tensor(data, device="npu") copies with the Python key excluded: the PrivateUse1
    # fallback cannot take NpuTensor arguments then (torch's Python fallback asserts)
    _kernels.impl("_copy_from", transfers.copy_from_kernel, "PrivateUse1")
    # allocations ask the emulated device first, so an out-of-memory is the NPU's, not the host's
    for name, op in (("empty.memory_format", torch.ops.aten.empty.memory_format),
                     ("empty_strided", torch.ops.aten.empty_strided.default)):
        _kernels.impl(name, _npu_empty(op), "PrivateUse1")


# --------------------------------------------------------------- Tensor.npu
def _tensor_npu(self, device=None, non_blocking=False, **kwargs):
    """``Tensor.npu``: copy to an NPU (the current one by default)."""
    if device is not None and type(device) is not int:
        try:
            d = torch.device(device)
        except (RuntimeError, TypeError):
            raise RuntimeError("Invalid device, must be npu device") from None
        if d.type != NPU:
            raise RuntimeError("Invalid device, must be npu device")
    return self.to(torch.device(NPU, device_index(device)), non_blocking=non_blocking, **kwargs)


def _module_npu(self, device=None):
    return self._apply(lambda t: _tensor_npu(t, device))


def _trace_without_device_init() -> None:
    """Tracing never computes on the emulated device, as torch traces for a device it must not
    initialise (``FakeTensorMode.avoid_device_init``): ``torch.tensor(data, device="npu")`` lifts
    the data on the host and copies it with the Python key on, and FakeTensorMode does not
    constant-propagate host-to-npu copies.  A compiled region's graph then holds a host constant and
    an H2D copy, never a real NpuTensor made while tracing (no stray task in the trace, and no
    constant FakeTensor standing for an NPU tensor, which Dynamo cannot fake)."""
    torch._C._set_only_lift_cpu_tensors(True)     # this thread; FakeTensorMode sets it for others
    from torch._subclasses.fake_tensor import FakeTensorMode

    declared = FakeTensorMode.__dict__["avoid_device_init"]

    def avoid_device_init(self) -> bool:
        if declared.fget(self):
            return True
        other = torch.cuda.is_available() or (hasattr(torch, "hpu") and torch.hpu.is_available())
        if torch.xpu._is_compiled():
            other = other or torch.xpu.is_available()
        return not other       # only the emulated npu made the device available

    FakeTensorMode.avoid_device_init = property(avoid_device_init, doc=declared.__doc__)


def _fake_cache_per_thread_device() -> None:
    """FakeTensorMode's dispatch cache is process-wide and keys a factory by its arguments: a bare
    npu device there means the tracing thread's current device, so the cached result of
    ``torch.ones(2, device="npu")`` traced on npu:0 would be handed to a rank tracing on npu:1.
    Such calls bypass the cache."""
    from torch._subclasses.fake_tensor import FakeTensorMode, _BypassDispatchCache

    cache_key = FakeTensorMode._cache_key
    if getattr(cache_key, "_npugraph", False):
        return

    def _cache_key(self, state, func, args, kwargs):
        device = kwargs.get("device") if kwargs else None
        if type(device) is torch.device and device.type == NPU and device.index is None:
            raise _BypassDispatchCache("a bare npu device (the tracing thread's current device)")
        return cache_key(self, state, func, args, kwargs)

    _cache_key._npugraph = True
    FakeTensorMode._cache_key = _cache_key


def _refuse_npu_storages() -> None:
    """``torch.UntypedStorage(n, device="npu")`` (and ``TypedStorage``, which makes one) asks the
    C++ allocator of PrivateUse1, which a Python backend cannot register: torch dereferences a null
    allocator and the whole pytest process dies with a segmentation fault.  Refuse it with an error
    instead; NPU memory here belongs to NPU tensors."""
    storage_new = torch.UntypedStorage.__new__

    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        if isinstance(device, (str, torch.device)) and torch.device(device).type == NPU:
            raise RuntimeError(
                f"pytest-npugraph: torch.UntypedStorage(..., device={str(device)!r}) is not emulated: NPU memory "
                f"belongs to NPU tensors here. Allocate a tensor instead (torch.empty(nbytes, dtype=torch.uint8, "
                f"device='npu')) and use it, or its untyped_storage(), where the storage was to be used.")
        return storage_new(cls, *args, **kwargs)

    torch.UntypedStorage.__new__ = __new__


def install(npu_module) -> None:
    """Register the npu device with torch (idempotent; cannot be undone within a process)."""
    global _installed, _library
    if _installed:
        return
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", NPU):
        raise RuntimeError(f"PrivateUse1 is already renamed to {name!r}; cannot emulate npu in this process")
    from torch.utils import backend_registration as br
    from torch.utils._device import _device_constructors

    defaulted = _device_constructors()      # read (and cached by torch) before a wrapper replaces a builtin
    if name != NPU:
        br._setup_privateuseone_for_python_backend(rename=NPU, backend_module=npu_module, device_guard=NpuDeviceGuard())
    from . import functional_collectives, special_ops, transfers

    transfers.install()         # the dispatch core's op handlers
    special_ops.install()
    functional_collectives.install()    # compiled collectives go to the emulated HCCL group
    _library = torch.library.Library("_", "IMPL")
    _library.fallback(_privateuse1_fallback, dispatch_key="PrivateUse1", with_keyset=True)
    _register_kernels()
    _resolve_bare_devices()
    _trace_without_device_init()
    _fake_cache_per_thread_device()
    _refuse_npu_storages()
    torch.Tensor.npu = _tensor_npu
    torch.nn.Module.npu = _module_npu
    from . import autocast, autograd_streams, pinned, rank_rng, serialization, storage
    from .ops import library

    library.install()
    storage.install()
    from . import aliasing, mixed_precision

    aliasing.install()
    mixed_precision.install()
    serialization.install()
    autocast.install()
    autograd_streams.install()
    pinned.install()
    rank_rng.install()          # wraps pinned's factories
    _default_device_sees_wrappers(defaulted)
    _installed = True


def _default_device_sees_wrappers(defaulted: set) -> None:
    """torch's default-device mode (``torch.set_default_device``, ``with torch.device(...)``) fills in
    ``device=`` only for the functions in ``defaulted``, a set torch builds once off ``torch.<name>``.
    Read before any wrapper replaced a builtin (``install``), it holds the builtins, which the wrappers
    end up calling, so eager factories see the mode; each wrapper of one (``torch.tensor``, ``ones``...
    wrapped for bare devices, ``pin_memory`` and rank generators) is added beside it, since Dynamo
    traces the wrapper as the constructor it wraps."""
    for builtin in list(defaulted):
        chain, fn = [], getattr(torch, getattr(builtin, "__name__", ""), None)
        while fn is not None and fn is not builtin:
            chain.append(fn)
            fn = getattr(fn, "__wrapped__", None)
        if fn is builtin:
            defaulted.update(chain)
