"""NPU graphs (mirrors ``torch_npu/npu/graphs.py``): ``NPUGraph``, ``graph``, ``graph_pool_handle``,
``make_graphed_callables`` and the SuperKernel scope ops, over the emulator's capture and replay
(``pytest_npugraph.runtime.graphs``)."""
from __future__ import annotations

import json
import os
import typing
import warnings
from typing import Optional

import torch
from torch.fx.node import has_side_effect

import torch_npu
from pytest_npugraph import trace as T
from pytest_npugraph.runtime import graph_names, graphs as _graphs
from pytest_npugraph.runtime.callsite import user_site
from pytest_npugraph.runtime.errors import ErrCode, pta_error
from pytest_npugraph.runtime.runtime import current as _rt
from pytest_npugraph.runtime.tensor import NpuTensor, span
from pytest_npugraph.errors import NotEmulated
from . import _save_tensor  # noqa: F401  (npu::save_npugraph_tensor / print_npugraph_tensor)

__all__ = ["is_current_stream_capturing", "graph_pool_handle", "graph_task_group_begin", "graph_task_group_end",
           "graph_task_update_begin", "graph_task_update_end", "NPUGraph", "graph", "make_graphed_callables",
           "super_kernel_scope_begin", "super_kernel_scope_end"]

_CAPTURE_MODES = ("global", "thread_local", "relaxed")


def is_current_stream_capturing() -> bool:
    """Whether a capture is underway on the current stream (never initialises the device)."""
    return torch_npu.npu.is_current_stream_capturing()


def graph_pool_handle():
    """An opaque ``(int, int)`` id of a new graph memory pool (share it with ``pool=``)."""
    return _graphs.pool_handle(_rt())


def _check_stream(stream):
    if not isinstance(stream, torch_npu.npu.Stream):
        raise RuntimeError("Need torch_npu.npu.Stream argument type." + pta_error(ErrCode.PARAM))
    if stream._state.external:
        raise RuntimeError("External NPU stream is not supported in graph task group. This path requires a "
                           "torch_npu-managed stream." + pta_error(ErrCode.NOT_SUPPORT))
    return stream._state


def graph_task_group_begin(stream) -> None:
    _rt().marker(T.TaskGroupBegin, _check_stream(stream))


def graph_task_group_end(stream):
    state = _check_stream(stream)
    _rt().marker(T.TaskGroupEnd, state)
    return torch_npu._C._NPUTaskGroupHandle(len(_rt().trace))


def graph_task_update_begin(stream, handle) -> None:
    _rt().marker(T.TaskUpdateBegin, _check_stream(stream), task_group=getattr(handle, "task_group", None))


def graph_task_update_end(stream) -> None:
    _rt().marker(T.TaskUpdateEnd, _check_stream(stream))


# ------------------------------------------------------------------ SuperKernel scopes
# torch_npu 2.14.0 passes the message and pta_error(...) as two arguments to RuntimeError in these four
# checks (npu/graphs.py: the scope-name checks, NPUGraph.update, super_kernel_optimize), so e.args[0] is
# the bare message and str(e) the tuple's repr; the emulator raises exactly what the wheel raises.
def _check_scope_name(scope_name) -> None:
    if scope_name is not None and not scope_name.strip():
        raise RuntimeError("scope_name should be None or a non-empty string.", pta_error(ErrCode.PARAM))


def _tracing() -> bool:
    return torch.compiler.is_compiling() or torch._C._get_dispatch_mode(
        torch._C._TorchDispatchModeKey.FAKE) is not None


def _scope_kernel(what: str):
    def kernel(scope_name: Optional[str] = None) -> None:
        _check_scope_name(scope_name)
        if _tracing():                      # Dynamo/AOT tracing a graph: not a run of the scope
            return
        rt = _rt()
        stream = rt.current_stream()
        if stream.capture is not None:      # part of the graph: the scope is replayed with its kernels
            stream.capture.mark(what, stream, name=scope_name)
        else:
            rt.marker(what, stream, name=scope_name)
    return kernel


_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _what in (("super_kernel_scope_begin", T.SuperKernelBegin), ("super_kernel_scope_end", T.SuperKernelEnd)):
    if not hasattr(torch.ops.npu, _name):
        _lib.define(f"{_name}(str? scope_name=None) -> ()")
        for _key in ("PrivateUse1", "BackendSelect", "CPU"):
            _lib.impl(_name, _scope_kernel(_what), _key)
        _lib.impl(_name, lambda scope_name=None: None, "Meta")
        has_side_effect(getattr(torch.ops.npu, _name).default)


def super_kernel_scope_begin(scope_name: Optional[str] = None):
    return torch.ops.npu.super_kernel_scope_begin(scope_name)


def super_kernel_scope_end(scope_name: Optional[str] = None):
    return torch.ops.npu.super_kernel_scope_end(scope_name)


# ---------------------------------------------------------------------------- NPUGraph
def _patched_step(step, update: dict):
    """A replay step with the arguments ``update`` names replaced: the capture recorded the call
    normalised (positional arguments as positional, whatever names the caller used), so a name is
    found through the op's schema; a name the op does not take is ignored."""
    fn, args, kwargs, dst = step
    schema = getattr(fn, "_schema", None)
    positions = {} if schema is None else {a.name: i for i, a in enumerate(schema.arguments)}
    args, kwargs = list(args), dict(kwargs)
    for name, value in update.items():
        if name in kwargs:
            kwargs[name] = value
        elif positions.get(name, len(args)) < len(args):
            args[positions[name]] = value
        elif name in positions and schema.arguments[positions[name]].kwarg_only:
            kwargs[name] = value
    return (fn, tuple(args), kwargs, dst)


# The options NPUGraph.super_kernel_optimize accepts (torch_npu 2.14.0): key -> value type, or
# (list, element type), or (dict, {sub-key: type}).
_SUPER_KERNEL_OPTIONS = {
    "optimize_options": {
        "preload_code": int, "split_mode": int, "stream_fusion": int, "constant_codegen": int,
        "auto_op_parallel": int, "opt_extend": str, "early_start": int,
        "dcci_before_kernel_start": (list, str), "dcci_after_kernel_end": (list, str),
        "dcci_disable_on_kernel": (list, str), "ubuf_lock_ignore_kernel": (list, str),
        "aggressive_opt_strategies": (dict, {"event_breaker_bypass": int, "value_breaker_bypass": int,
                                             "task_breaker_bypass": int}),
    },
    "debug_options": {
        "debug_sync_all": int, "debug_op_exec_trace": int, "debug_cross_core_sync_check": int,
        "debug_extend": str, "debug_per_op_max_core_num": int,
    },
}


def _check_super_kernel_options(name: str, options) -> None:
    """torch_npu's checks of a super_kernel_optimize option dict, with its messages."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise RuntimeError(f"{name} param must be dict or None.", pta_error(ErrCode.PARAM))
    known = _SUPER_KERNEL_OPTIONS[name]
    for key, value in options.items():
        if key not in known:
            raise RuntimeError(f"Invalid {name} param key: '{key}'.", pta_error(ErrCode.PARAM))
        rule = known[key]
        expected, inner = rule if isinstance(rule, tuple) else (rule, None)
        if not isinstance(value, expected):
            raise RuntimeError(f"{name} param['{key}'] must be {expected.__name__}, got {type(value).__name__}",
                               pta_error(ErrCode.PARAM))
        if expected is dict:
            for sub_key, sub_value in value.items():
                if sub_key not in inner:
                    raise RuntimeError(f"Invalid sub_key '{sub_key}' in {name}['{key}'].", pta_error(ErrCode.PARAM))
                if not isinstance(sub_value, inner[sub_key]):
                    raise RuntimeError(f"{name}['{key}']['{sub_key}'] must be {inner[sub_key].__name__}, "
                                       f"got {type(sub_value).__name__}", pta_error(ErrCode.PARAM))
        elif expected is list:
            for i, element in enumerate(value):
                if not isinstance(element, inner):
                    raise RuntimeError(f"{name}['{key}'][{i}] must be {inner.__name__}, got "
                                       f"{type(element).__name__}", pta_error(ErrCode.PARAM))


class NPUGraph:
    """A captured NPU graph: ``capture_begin``/``capture_end`` record the work issued on the capture
    stream, ``replay`` runs it again (on the current stream) over the same memory."""

    def __new__(cls):
        return super().__new__(cls)

    def __init__(self):
        self.auto_dispatch_capture = False
        self._capture = None
        self._graph = None
        self._pool = None
        self._updatable: list = []

    @staticmethod
    def get_currently_capturing_graph():
        rt = _rt()
        capture = rt.current_stream().capture
        return None if capture is None else capture.owner

    def capture_begin(self, pool=None, capture_error_mode="global"):
        """Begin capturing NPU work on the current stream (``graph`` calls this)."""
        if capture_error_mode not in _CAPTURE_MODES:
            raise RuntimeError("Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got "
                               f"{capture_error_mode}")
        if os.environ.get("TASK_QUEUE_ENABLE") == "2":
            raise RuntimeError("Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture, please export "
                               "TASK_QUEUE_ENABLE=1/0.")
        if self._graph is not None or self._capture is not None:
            raise RuntimeError("This NPUGraph instance already owns a captured graph. To capture a new graph, "
                               "create a new instance.")
        rt = _rt()
        stream = rt.current_stream()
        if stream is rt.device(stream.device).default_stream:
            raise RuntimeError("NPU graphs must be captured on a non-default stream. (However, after capture, "
                               "it's ok to replay them on the default stream.)")
        self._pool = tuple(pool) if pool is not None else _graphs.private_pool(rt)
        # named after the user's line that began it: the `with torch.npu.graph(...)` line
        graph = getattr(self, "_graph_id", None) or T.GraphCall(graph_names.captured(rt, user_site(1)))
        self._capture = _graphs.Capture(rt, stream, self._pool, graph)
        self._capture.owner = self
        self._capture.updatable = _graphs.updatable_ops() if self.auto_dispatch_capture else ()

    def capture_end(self):
        """End the capture (on the stream it began on); the graph can then be replayed."""
        rt = _rt()
        capture = self._capture
        if capture is None:
            raise RuntimeError("capture_end() called before capture_begin().")
        if rt.current_stream() is not capture.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        self._capture = None
        self._updatable = list(capture.updated)
        self._graph = capture.end(aborted=getattr(self, "_aborting", False))

    def replay(self):
        """Run the captured work again, on the current stream of the device it was captured on (as
        ``NPUGraph::replay``'s device guard)."""
        if self._graph is None:
            raise RuntimeError("Called NPUGraph::replay without a preceding successful capture.")
        rt = _rt()
        if self._graph.runtime() is not rt:
            raise RuntimeError("pytest-npugraph: this NPUGraph was captured in another test; every test starts with "
                               "a fresh emulated device, so capture the graph in the test that replays it.")
        self._graph.replay(rt, rt.current_stream(self._graph.origin.device))   # the capture device's stream

    def reset(self):
        """Drop the captured graph (its pool memory is released with the tensors that hold it)."""
        self._graph = None
        self._capture = None

    def pool(self):
        """The id of this graph's memory pool (share it with another capture's ``pool=``)."""
        if self._graph is None:
            raise RuntimeError("Called NPUGraph::pool() without a preceding successful capture.")
        return self._pool

    def update(self, cpu_update_input):
        """Patch arguments of the attention ops recorded with ``auto_dispatch_capture=True``."""
        if not self.auto_dispatch_capture:
            raise RuntimeError("The current graph configuration does not support update,"
                               "Try to capture by setting auto_dispatch_capture=True during capture",
                               pta_error(ErrCode.PARAM))
        records = self._updatable
        if len(cpu_update_input) == 1:
            cpu_update_input = [dict(cpu_update_input[0]) for _ in records]
        if len(cpu_update_input) != len(records):
            raise RuntimeError(f"Currently, there are {len(records)} operators that need to be updated by capture, "
                               f"and there are only {len(cpu_update_input)} elements in the incoming "
                               f"cpu_update_input list", pta_error(ErrCode.PARAM))
        for index, update in zip(records, cpu_update_input):
            self._graph.steps[index] = _patched_step(self._graph.steps[index], update)

    def debug_dump(self, debug_path):
        """Write the captured tasks as Chrome-trace JSON (and an ``.aligned.json`` copy)."""
        if self._graph is None:
            warnings.warn("Called NPUGraph::debug_dump without a preceding successful capture.")
            return None
        events = [{"name": op, "ph": "X", "tid": stream, "pid": 0, "ts": i, "dur": 1}
                  for i, (stream, op) in enumerate(self._graph.kernels())]
        for path in (debug_path, os.path.splitext(debug_path)[0] + ".aligned.json"):
            with open(path, "w", encoding="utf-8") as f:
                json.dump(events, f)
        return None

    def super_kernel_optimize(self, optimize_options=None, debug_options=None):
        for name, options in (("optimize_options", optimize_options), ("debug_options", debug_options)):
            _check_super_kernel_options(name, options)
        _rt().marker(T.SuperKernelOptimize, optimize=repr(optimize_options), debug=repr(debug_options))

    def enable_debug_mode(self):
        pass

    def register_generator_state(self, generator):
        warnings.warn("register_generator_state is deprecated and does nothing.", DeprecationWarning)


class graph:
    """Context manager capturing NPU work into an ``NPUGraph`` (``pool=`` shares a memory pool;
    ``stream=`` is the capture stream, a shared internal side stream by default)."""

    default_capture_stream: typing.Optional["torch.npu.Stream"] = None   # the running test's (see __init__)

    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
                 capture_error_mode: str = "global"):
        cls = self.__class__
        stash = _rt().stash
        if stash.capture_stream is None:
            stash.capture_stream = torch.npu.Stream()
        cls.default_capture_stream = stash.capture_stream
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        if self.capture_stream is None:
            raise RuntimeError("capture stream is None")
        self.stream_ctx = torch.npu.stream(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        self.npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self):
        torch.npu.synchronize()
        torch.npu.empty_cache()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, exc_type, exc_value, traceback):
        self.npu_graph._aborting = exc_type is not None
        try:
            self.npu_graph.capture_end()
        finally:
            self.npu_graph._aborting = False
        self.stream_ctx.__exit__(exc_type, exc_value, traceback)


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    """Capture each callable's forward into an ``NPUGraph`` (one shared pool) and return callables
    that copy their inputs into the static inputs and replay.  Inference only: sample arguments
    must not require grad (the backward graphs of the real function are not emulated)."""
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. Please set "
                           "`cache_enabled=False`.")
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise RuntimeError("Modules must not have hooks registered at the time they are passed. However, "
                                   "registering hooks on modules after passing them through make_graphed_callables "
                                   "is allowed.")
            if any(b.requires_grad for b in c.buffers()):
                raise RuntimeError("In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, "
                                   "only parameters may be trainable. All buffers must have "
                                   "``requires_grad=False``.")
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise RuntimeError("In the beta API, sample_args for each callable must contain only Tensors. Other "
                               "types are not allowed.")
        if any(a.requires_grad for a in args):
            raise NotEmulated("pytest-npugraph emulates make_graphed_callables for inference only "
                              "(sample_args requiring grad need the backward graphs).")
    mempool = graph_pool_handle() if pool is None else pool
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side), torch.no_grad():
        for c, args in zip(callables, sample_args):
            for _ in range(num_warmup_iters):
                c(*args)
    torch.npu.current_stream().wait_stream(side)
    graphed = []
    for c, args in zip(callables, sample_args):
        g = NPUGraph()
        with torch.no_grad(), graph(g, pool=mempool):
            outputs = c(*args)
        graphed.append(_graphed(g, args, outputs))
    return graphed[0] if just_one else tuple(graphed)


def _graphed(g, static_inputs, static_outputs):
    flat_out, spec = torch.utils._pytree.tree_flatten(static_outputs)

    def run(*inputs):
        for dst, src in zip(static_inputs, inputs):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        g.replay()
        outputs = [t.detach() for t in flat_out]
        _name_call_outputs(g, outputs)
        return torch.utils._pytree.tree_unflatten(outputs, spec)
    return run


def _name_call_outputs(g, outputs) -> None:
    """Tag this call's output handles and name them in the trace, as a compiled graph call does
    (``GraphOutputs``, for the output-overwrite analysis)."""
    handles = [t for t in outputs if isinstance(t, NpuTensor)]
    call = g._graph.graph.replayed(g._graph.replays)
    for t in handles:
        t._graph_call = call
    rt = _rt()
    rt.marker(T.GraphOutputs, rt.current_stream(), call=call, spans=tuple(span(t) for t in handles),
              site=user_site(3))
