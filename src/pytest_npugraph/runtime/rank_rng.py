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

Limits: a draw made by torch's C++ from a path that passes none of these entry points (a random
op inside a compiled graph, ``torch.default_generator`` used directly) still reads the shared
generator.
"""
from __future__ import annotations

import functools
import threading

import torch

from . import generators

_local = threading.local()       # .generator: the rank's CPU generator; .inside: a swap is open
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
    _local.inside = False
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
        if g is None or _local.inside or _on_npu(args, kwargs):
            return original(*args, **kwargs)
        _local.inside = True
        try:
            with generators.drawing(g):
                return original(*args, **kwargs)
        finally:
            _local.inside = False
    call._npugraph_rank_rng = True
    return call


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
