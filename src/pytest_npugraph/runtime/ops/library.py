"""Register the torch_npu custom ops as ``torch.ops.npu.*`` with CPU reference kernels.

Schemas come from the family modules' specs (the real ones, see ``registry``) and from users' ``pytest_npugraph_register_ops``
hook.  Each op gets a CPU kernel (the reference math; on NPU tensors it runs through the
NpuTensor dispatch, which records the task) and a Meta kernel (so torch.compile can trace it).

A mutable op ``op`` (``Tensor(a!)`` arguments) with a registered ``op_functional`` also gets a
Functionalize kernel, the Python counterpart of the one torchgen writes for torch_npu: under
functionalization (``torch.func.functionalize``, AOTAutograd) ``op`` becomes a call of
``op_functional`` whose trailing outputs replace the mutated arguments, so graphs hold the
functional op (and ``copy_`` epilogues for mutated graph inputs), not ``auto_functionalized``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from ..._context import CONTEXT

NAMESPACE = "npu"
_library: Optional[torch.library.Library] = None
SPECS: dict = {}      # name -> OpSpec registered in this process


@dataclass(frozen=True)
class UserOp:
    name: str
    schema: str
    impl: Callable
    cores: object = None


class OpRegistry:
    """Handed to ``pytest_npugraph_register_ops``: ``registry.register(name, schema, impl, cores=...)``.

    ``schema`` is the op's schema without the namespace, e.g.
    ``"npu_my_op(Tensor x, int k=1) -> Tensor"``; ``impl`` computes it on CPU tensors;
    ``cores`` is a profile dict such as ``{"kind": "AIV", "vector": "all", "all_resident": False}``.
    """

    def __init__(self):
        self.ops: list = []

    def register(self, name: str, schema: str, impl: Callable, cores=None) -> None:
        if not schema.startswith(name + "("):
            raise ValueError(f"schema for {name!r} must start with '{name}(', got {schema!r}")
        self.ops.append(UserOp(name, schema, impl, cores))


@contextlib.contextmanager
def _real_cpu_compute():
    """Plain CPU compute inside a meta kernel: FakeTensorMode runs meta kernels with the Meta key
    forced on for every op (and a tracer's modes live), so the reference's own factories
    (``torch.arange``...) would otherwise go to Meta and its decompositions, and loop."""
    with _disable_current_modes(), torch._C._PreserveDispatchKeyGuard():
        torch._C._set_meta_in_tls_dispatch_include(False)
        yield


def _meta_kernel(impl):
    """Shapes by running the reference on zeros of the same shapes (static shapes only)."""
    def to_cpu(x):
        if isinstance(x, torch.Tensor):
            return torch.zeros(x.shape, dtype=x.dtype)
        return x

    def kernel(*args, **kwargs):
        with _real_cpu_compute():
            out = impl(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
            return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, out)
    return kernel


FUNCTIONAL_SUFFIX = "_functional"
_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
_FUNCTIONALIZED: set = set()    # mutable ops given a Functionalize kernel in this process


def _functionalize_kernel(mutable, functional):
    """The Functionalize kernel of OpOverload ``mutable``, given its out-of-place ``functional``
    variant (same arguments; returns ``mutable``'s returns followed by the new value of each
    written argument, in argument order), as torchgen generates it for a mutable op."""
    schema = mutable._schema
    arguments = schema.arguments
    written = [i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
    n_returns = len(schema.returns)

    def argument(args, kwargs, i):
        a = arguments[i]
        if not a.kwarg_only and i < len(args):
            return args[i]
        return kwargs.get(a.name, a.default_value if a.has_default_value() else None)

    def is_functional(x) -> bool:
        return isinstance(x, torch.Tensor) and torch._is_functional_tensor(x)

    def unwrap(x):
        if is_functional(x):
            torch._sync(x)
            return torch._from_functional_tensor(x)
        return x

    def kernel(*args, **kwargs):
        targets = [argument(args, kwargs, i) for i in written]
        if not all(is_functional(t) for t in targets):
            others = [argument(args, kwargs, i) for i in range(len(arguments)) if i not in written]
            if any(is_functional(x) for x in tree_flatten(others)[0]):
                raise RuntimeError(
                    f"{schema.name}: mutating a non-functional tensor with a functional tensor is not allowed. "
                    "Please ensure that all of your inputs are wrapped inside of a functionalize() call.")
            with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):   # nothing functional: run it as is
                return mutable(*args, **kwargs)
        uargs, ukwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            out = functional(*uargs, **ukwargs)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        for target, value in zip(targets, out[n_returns:]):
            torch._functionalize_replace(target, value)
            torch._functionalize_commit_update(target)
            torch._functionalize_sync(target)
        results = tuple(torch._to_functional_tensor(r) if isinstance(r, torch.Tensor) else r
                        for r in out[:n_returns])
        if n_returns == 0:
            return None
        return results[0] if n_returns == 1 else results
    return kernel


def _overload(qualified: str):
    base, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops, NAMESPACE), base).__getattr__(overload or "default")


def _add_functionalization(qualified: str) -> None:
    """Pair ``qualified`` (mutable) with ``<base>_functional[.overload]`` if both are registered."""
    base, dot, overload = qualified.partition(".")
    partner = base + FUNCTIONAL_SUFFIX + dot + overload
    if partner not in SPECS or qualified in _FUNCTIONALIZED:
        return
    mutable = _overload(qualified)
    if not mutable._schema.is_mutable:
        return
    _library.impl(qualified, _functionalize_kernel(mutable, _overload(partner)), "Functionalize")
    _FUNCTIONALIZED.add(qualified)


def _define(spec) -> None:
    qualified = spec.schema.split("(", 1)[0]          # "npu_grouped_matmul.List"
    if qualified in SPECS:
        return
    _library.define(spec.schema)
    _library.impl(qualified, spec.impl, "CPU")
    _library.impl(qualified, getattr(spec, "meta", None) or _meta_kernel(spec.impl), "Meta")
    SPECS[qualified] = spec


def install() -> None:
    """Define every family op and every op users register through the hook (once per process)."""
    global _library
    if _library is None:
        _library = torch.library.Library(NAMESPACE, "DEF")
    from . import registry

    specs = list(registry.specs())
    if CONTEXT.hook is not None:
        registry = OpRegistry()
        CONTEXT.hook.pytest_npugraph_register_ops(registry=registry)
        specs += registry.ops
    for spec in specs:
        _define(spec)
    for qualified in list(SPECS):
        _add_functionalization(qualified)


def cores_of(name: str):
    """The declared profile of custom op ``name`` (any overload), or None."""
    spec = SPECS.get(name)
    return None if spec is None else spec.cores
