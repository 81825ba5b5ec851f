"""Each ``run_ranks`` rank thread has its own CPU random generator, as each rank process has on hardware.

Why: a real job's ranks are processes, each with torch's CPU default generator of its own, so
``torch.manual_seed(0); x = torch.randn(n)`` gives every rank the same ``x`` (the usual way to
give the ranks the same weights or inputs).  ``run_ranks`` runs the ranks as threads of one
process, which share torch's one CPU default generator: each rank drew the numbers the others
left, in whatever order the threads happened to run, so values differed between ranks and
between runs of the same test (measured: 5 runs of 5 with ``torch.manual_seed(0)`` then 20
``torch.randn(64)`` per rank gave different values on the two ranks).

What this does: a rank thread gets a CPU generator at c10's default seed (a fresh process's, as
``torchrun``/``spawn`` start the ranks), and the Python entry points that draw from, seed or read
torch's CPU default generator (``torch.rand*``/``randn*``/``randint*``/``randperm``/``normal``/
``bernoulli``/``multinomial``/``poisson``, the dropout family in ``torch`` and
``torch.nn.functional``, the in-place samplers ``Tensor.uniform_``/``normal_``/``random_``/...
that ``torch.nn.init`` uses, ``torch.manual_seed``/``seed``/``initial_seed``/``get_rng_state``/
``set_rng_state``) run, in a rank thread, with the default generator holding that rank's state
(``generators.drawing``, one swap at a time).  Outside rank threads and inside Dynamo's tracing
they are torch's functions unchanged.  A rank thread's NPU generators are its own too
(``generators.default_generator``): ``torch.manual_seed`` in rank 1 (which seeds every NPU, as
torch_npu's does) no longer resets the generator rank 0 is drawing from on npu:0.

Compiled graphs (every backend: TorchAir's GE, reduce-overhead, npugraph_ex, aot_eager, eager)
call aten ops, not these entry points.  A graph Dynamo compiles that draws (a random torch function
or method, a seeded aten op) runs, in a rank thread, under a dispatch mode (``_RankDraws``) that
gives each CPU op that draws from the default generator the rank's state, one op at a time; ops on
NPU tensors draw from the rank's device generators on their own path.  The swap is per op, never
across the graph: a graph that waits for another rank (a host read of a collective's result) must
not hold the swap that rank needs to draw.

Limits: ``torch.default_generator`` used directly in a rank thread is torch's shared one.
"""
from __future__ import annotations

import functools
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import generators

_local = threading.local()       # .generator: the rank's CPU generator
_installed = False
_dynamo_tracing = torch.compiler.is_dynamo_compiling

_TORCH = ("rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal", "bernoulli",
          "multinomial", "poisson", "dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout",
          "native_dropout", "rrelu", "rrelu_", "manual_seed", "seed", "initial_seed", "get_rng_state",
          "set_rng_state")
_RANDOM = ("manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state")      # torch.random's own names
_FUNCTIONAL = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "rrelu",
               "rrelu_", "scaled_dot_product_attention")
_METHODS = ("uniform_", "normal_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "bernoulli_",
            "bernoulli", "multinomial")


def enter_rank() -> None:
    """Called at the start of a rank thread: its own CPU generator, and its own NPU generators (made
    on first use), at a fresh process's seed."""
    g = torch.Generator()
    g.manual_seed(generators.DEFAULT_SEED)
    _local.generator = g
    generators._rank.npu = {}


def leave_rank() -> None:
    _local.generator = None
    generators._rank.npu = None


def _on_npu(args, kwargs) -> bool:
    """An NPU call: it draws from the device's generator (``generators.drawing_on``), and holding the
    swap lock across it (it may wait for the device) would stall the other ranks' draws."""
    device = kwargs.get("device")
    if device is not None and str(device).startswith("npu"):
        return True
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.device.type == "npu"
    return any(isinstance(v, torch.Tensor) and v.device.type == "npu" for v in kwargs.values())


def _on_rank_generator(original):
    @functools.wraps(original)
    def call(*args, **kwargs):
        if _dynamo_tracing():               # first: Dynamo folds it to True and traces torch's function
            return original(*args, **kwargs)
        g = getattr(_local, "generator", None)
        if g is None or generators.swapped() or _on_npu(args, kwargs):
            return original(*args, **kwargs)
        with generators.drawing(g):
            return original(*args, **kwargs)
    call._npugraph_rank_rng = True
    return call


class _RankDraws(TorchDispatchMode):
    """While a compiled graph runs in a rank thread: an op that draws from the CPU default
    generator (seeded, no generator of its own, no NPU operand) draws from the rank's."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        g = getattr(_local, "generator", None)
        if (g is None or not generators.seeded(func) or kwargs.get("generator") is not None
                or generators.swapped() or _on_npu(args, kwargs)):
            return func(*args, **kwargs)
        with generators.drawing(g):
            return func(*args, **kwargs)


def _on_rank_generators(compiled_fn):
    """``compiled_fn`` (what a backend made of a graph that draws), run under ``_RankDraws`` when
    called in a rank thread."""
    def run(*args, **kwargs):
        if getattr(_local, "generator", None) is None:
            return compiled_fn(*args, **kwargs)
        with _RankDraws():
            return compiled_fn(*args, **kwargs)
    run.__name__ = getattr(compiled_fn, "__name__", "compiled_fn")
    run.__wrapped__ = compiled_fn
    return run


_DRAWING_NAMES = frozenset(_TORCH + _FUNCTIONAL) - frozenset(_RANDOM)


def _draws(gm) -> bool:
    """Whether the Dynamo graph ``gm`` (or a subgraph of a higher-order op) may draw random numbers
    (a module call is not looked into: it may)."""
    for module in gm.modules():
        graph = getattr(module, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            if node.op == "call_module" or node.op == "call_method" and node.target in _METHODS:
                return True
            if node.op != "call_function":
                continue
            target = node.target
            if getattr(target, "_npugraph_rank_rng", False) or getattr(target, "__name__", None) in _DRAWING_NAMES:
                return True
            if isinstance(target, torch._ops.OpOverload) and generators.seeded(target):
                return True
            if isinstance(target, torch._ops.OpOverloadPacket) and any(
                    generators.seeded(getattr(target, name)) for name in target.overloads()):
                return True
    return False


def register_with_dynamo() -> None:
    """A graph Dynamo compiles that draws runs on the rank's generators in rank threads (whatever
    the backend): called when ``torch._dynamo`` is first imported."""
    import sys

    module = sys.modules.get("torch._dynamo.output_graph")      # loaded with torch._dynamo
    if module is None:
        return
    OutputGraph = module.OutputGraph
    original = OutputGraph.call_user_compiler
    if getattr(original, "_npugraph_rank_rng", False):
        return

    @functools.wraps(original)
    def call_user_compiler(self, gm, example_inputs):
        compiled_fn = original(self, gm, example_inputs)
        return _on_rank_generators(compiled_fn) if _draws(gm) else compiled_fn
    call_user_compiler._npugraph_rank_rng = True
    OutputGraph.call_user_compiler = call_user_compiler


def _replace(owner, name: str, register_builtin: bool) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_npugraph_rank_rng", False):
        return
    wrapper = _on_rank_generator(original)
    setattr(owner, name, wrapper)
    if register_builtin:         # TorchScript resolves torch.<name> by identity: the wrapper is the same op
        op = torch.jit._builtins._find_builtin(original)
        if op is not None:
            torch.jit._builtins._register_builtin(wrapper, op)


def install() -> None:
    """Once per process (``backend.install``, after ``pinned``, whose factories these wrap)."""
    global _installed
    if _installed:
        return
    import torch.nn.functional as F
    import torch.random

    for name in _TORCH:
        _replace(torch, name, True)
    for name in _RANDOM:
        setattr(torch.random, name, getattr(torch, name))      # fork_rng and others call them from there
    for name in _FUNCTIONAL:
        _replace(F, name, True)
    for name in _METHODS:
        _replace(torch.Tensor, name, False)
    _installed = True
