"""torch_npu's Dynamo patch (mirrors ``torch_npu/utils/_dynamo.py``, ``_dynamo_device.py`` and the
backend registration in ``torch_npu/dynamo/__init__.py``), applied when ``torch._dynamo`` is first
imported (or at once when it already is):

* the ``npu`` device interface (its ``Stream``/``Event`` classes, ``current_stream``, ``set_stream``),
  so Dynamo traces ``torch.npu.Stream``/``Event`` objects as streams and events;
* ``torch.npu.Stream``/``Event`` constructed inside a compiled region stay in the graph;
* ``with torch.npu.stream(s):`` puts ``torch.npu.set_stream`` nodes into the graph (entering and
  leaving), which TorchAir's ``replace_stream_event_pass`` turns into stream scopes;
* ``torch.npu.current_stream()`` is traced like ``torch.accelerator.current_stream()``;
* the ``npu`` and ``npugraph_ex`` backends are registered with Dynamo.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

NPUGRAPH_EX_BACKEND = "npugraph_ex"
_DONE: set = set()


def _interface():
    from torch._dynamo.device_interface import DeviceInterface

    import torch_npu

    npu = torch_npu.npu

    class NpuInterface(DeviceInterface):
        device = torch.device
        Event = npu.Event
        Stream = npu.Stream
        current_device = staticmethod(npu.current_device)
        set_device = staticmethod(npu.set_device)
        device_count = staticmethod(npu.device_count)
        stream = staticmethod(npu.stream)
        current_stream = staticmethod(npu.current_stream)
        set_stream = staticmethod(npu.set_stream)
        synchronize = staticmethod(npu.synchronize)
        get_device_properties = staticmethod(npu.get_device_properties)
        _set_stream_by_id = staticmethod(None)

        @staticmethod
        def is_available() -> bool:
            return npu.device_count() > 0

        @staticmethod
        def get_compute_capability(device=None):
            return npu.get_device_name(device)

        @staticmethod
        def exchange_device(device: int) -> int:
            current = npu.current_device()
            npu.set_device(device)
            return current

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            return device

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False):
            return True

    return NpuInterface


def _register_interface() -> None:
    from torch._dynamo.device_interface import register_interface_for_device
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    interface = _interface()
    register_interface_for_device("npu", interface)
    for i in range(32):
        register_interface_for_device(f"npu:{i}", interface)
    from torch_npu import _accelerator

    handlers = TorchInGraphFunctionVariable._get_handlers()
    accelerator = handlers.get(_accelerator._accelerator_current_stream) or handlers.get(_accelerator.current_stream)
    if accelerator is not None:     # torch.accelerator.current_stream is the emulator's (_accelerator.py)
        for fn in (torch.npu.current_stream, _accelerator.current_stream, _accelerator._accelerator_current_stream):
            handlers[fn] = accelerator


def _patch_in_graph_classes() -> None:
    import functools

    from torch._dynamo.variables.user_defined import UserDefinedClassVariable

    original = UserDefinedClassVariable._in_graph_classes
    if getattr(original, "_npugraph", False):
        return

    @staticmethod
    @functools.lru_cache(None)
    def in_graph_classes():
        result = set(original())
        result.add(torch.npu.Event)
        result.add(torch.npu.Stream)
        return result

    in_graph_classes.__func__._npugraph = True
    UserDefinedClassVariable._in_graph_classes = in_graph_classes


_IN_GRAPH_FUNCTIONS = ("torch.npu.current_stream", "torch.npu.default_stream", "torch.npu.stream", "torch.npu.set_stream",
                       "torch_npu.npu.stream", "torch_npu.npu.utils.stream", "torch_npu.npu.utils.synchronize",
                       "torch.npu.current_device", "torch.npu.is_available", "torch.npu.get_device_properties",
                       "torch_npu._accelerator.current_stream")


def _patch_trace_rules() -> None:
    """torch_npu's trace rules: these ``torch.npu`` functions are traced into the graph, not inlined."""
    from torch._dynamo import trace_rules
    from torch._dynamo.variables import TorchInGraphFunctionVariable
    import torch._dynamo.variables.torch as torch_module

    trace_rules.clear_lru_cache()
    trace_rules.torch_name_rule_map.append(dict.fromkeys(_IN_GRAPH_FUNCTIONS, TorchInGraphFunctionVariable))
    torch_module.constant_fold_functions[torch.npu.current_device] = True
    torch_module.constant_fold_functions_need_guards[torch.npu.current_device] = True
    torch_module.constant_fold_functions[torch.npu.is_available] = True


def _patch_python_types() -> None:
    streams = torch._dynamo.variables.streams

    def python_type(self):
        return type(self.value)

    streams.StreamVariable.python_type = python_type
    streams.EventVariable.python_type = python_type


def _patch_stream_context() -> None:
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._dynamo.variables.builder import wrap_fx_proxy_cls
    from torch._dynamo.variables.streams import StreamContextVariable, StreamVariable
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    class NpuStreamContextVariable(StreamContextVariable):
        """``with torch.npu.stream(s)``: ``set_stream(s)`` on entry, the saved stream on exit."""

        @staticmethod
        def create(tx, stream_to_enter, **kwargs):
            interface = get_interface_for_device(stream_to_enter.device)
            current = wrap_fx_proxy_cls(StreamVariable, tx, tx.output.create_proxy(
                "call_function", interface.current_stream, (None,), {}))
            return NpuStreamContextVariable(stream_to_enter, current_stream=current, device_interface=interface,
                                            **kwargs)

        def __init__(self, stream, current_stream=None, device_interface=None, **kwargs):
            self.current_stream = current_stream
            self.device_interface = device_interface
            super().__init__(stream, **kwargs)

        def enter(self, tx, *args):
            if self.get_stream():
                tx.output.create_proxy("call_function", self.device_interface.set_stream,
                                       (self.get_stream().as_proxy(),), {})
            return super().enter(tx)

        def exit(self, tx, *args):
            if self.get_stream():
                tx.output.create_proxy("call_function", self.device_interface.set_stream,
                                       (self.current_stream.as_proxy(),), {})
            return super().exit(tx, *args)

    def handle_stream(self, tx, stream):
        return NpuStreamContextVariable.create(tx, stream)

    TorchInGraphFunctionVariable._get_handlers()[get_interface_for_device("npu").stream] = handle_stream


def _patch_stream_ops() -> None:
    """Dynamo's ``streams::`` ops (``wait_stream``, ``fork``, ``join``, events) look their streams up by
    index; the current stream there is a plain ``torch.Stream`` (from ``torch.accelerator``), whose
    methods reach no NPU runtime here: hand the ops the torch_npu stream it names instead, so a
    compiled region run by the eager or aot_eager backend waits as written."""
    streams = sys.modules.get("torch._dynamo.variables.streams")
    if streams is None or getattr(streams._get_stream_by_index, "_npugraph", False):
        return
    original = streams._get_stream_by_index

    def _get_stream_by_index(index: int):
        from torch_npu.npu.streams import as_npu_stream

        return as_npu_stream(original(index))

    _get_stream_by_index._npugraph = True
    streams._get_stream_by_index = _get_stream_by_index


def _patch_builtin_id() -> None:
    builtin = torch._dynamo.variables.builtin
    original = builtin.BuiltinVariable.call_id
    if getattr(original, "_npugraph", False):
        return

    def call_id(self, tx, *args):
        if builtin.istype(args[0], torch._dynamo.variables.streams.EventVariable):
            return torch._dynamo.variables.ConstantVariable.create(id(args[0].value))
        return original(self, tx, *args)

    call_id._npugraph = True
    builtin.BuiltinVariable.call_id = call_id


def _refuse_inductor_for_npu() -> None:
    """With the npu device interface registered, inductor would start compiling NPU graphs (its
    joint-graph patterns on npu tensors) before asking for the npu code generators that say it
    cannot: refuse at its entry instead, with the same message."""
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__
    if getattr(original, "_npugraph", False):
        return

    def __call__(self, model_, inputs_):
        if any(isinstance(t, torch.Tensor) and t.device.type == "npu" for t in inputs_):
            from torch_npu._accelerator import INDUCTOR_MESSAGE

            raise RuntimeError(INDUCTOR_MESSAGE)
        return original(self, model_, inputs_)

    __call__._npugraph = True
    wrapper.__call__ = __call__


def _npugraph_ex_backend(gm, example_inputs, **kwargs):
    """``torch.compile(model, backend="npugraph_ex", options={...})``."""
    from torch_npu.dynamo.npugraph_ex import _backend

    return _backend(gm, example_inputs, **kwargs)


def _npu_backend(gm, example_inputs, **kwargs):
    """``torch.compile(model, backend="npu")``: TorchAir's default backend."""
    import torchair

    return torchair.get_npu_backend()(gm, example_inputs, **kwargs)


def _register_backends() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    for name, fn in (("npu", _npu_backend), (NPUGRAPH_EX_BACKEND, _npugraph_ex_backend)):
        if _COMPILER_FNS.get(name) is fn:
            continue
        _BACKENDS.pop(name, None)
        _COMPILER_FNS.pop(name, None)
        register_backend(fn, name)


def setup() -> None:
    """Apply every step once (each is idempotent on its own)."""
    from pytest_npugraph.runtime import backend, rank_rng

    for name, step in (("trace_rules", _patch_trace_rules), ("bare_devices", backend.register_with_dynamo),
                       ("rank_generators", rank_rng.register_with_dynamo),
                       ("compiled_backward", backend.register_with_aot_autograd),
                       ("device_interface", _register_interface), ("in_graph_classes", _patch_in_graph_classes),
                       ("python_types", _patch_python_types), ("stream_context", _patch_stream_context),
                       ("stream_ops", _patch_stream_ops),
                       ("builtin_id", _patch_builtin_id), ("inductor", _refuse_inductor_for_npu),
                       ("backends", _register_backends)):
        if name not in _DONE:
            step()
            _DONE.add(name)


class _AfterDynamoImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``setup`` once ``torch._dynamo`` has been imported (importing it costs seconds)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        setup()


def install() -> None:
    if "torch._dynamo" in sys.modules:
        setup()
    elif not any(isinstance(f, _AfterDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamoImport())
