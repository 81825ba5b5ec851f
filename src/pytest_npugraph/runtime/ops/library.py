"""Register the torch_npu custom ops as ``torch.ops.npu.*`` with CPU reference kernels.

Schemas come from the catalog (the real ones) and from users' ``pytest_npugraph_register_ops``
hook.  Each op gets a CPU kernel (the reference math; on NPU tensors it runs through the
NpuTensor dispatch, which records the task) and a Meta kernel (so torch.compile can trace it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.utils._pytree import tree_map

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


def _meta_kernel(impl):
    """Shapes by running the reference on zeros of the same shapes (static shapes only)."""
    def to_cpu(x):
        if isinstance(x, torch.Tensor):
            return torch.zeros(x.shape, dtype=x.dtype)
        return x

    def kernel(*args, **kwargs):
        out = impl(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
        return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, out)
    return kernel


def _define(spec) -> None:
    qualified = spec.schema.split("(", 1)[0]          # "npu_grouped_matmul.List"
    if qualified in SPECS:
        return
    _library.define(spec.schema)
    _library.impl(qualified, spec.impl, "CPU")
    _library.impl(qualified, _meta_kernel(spec.impl), "Meta")
    SPECS[qualified] = spec


def install() -> None:
    """Define every catalog op and every op users register through the hook (once per process)."""
    global _library
    if _library is None:
        _library = torch.library.Library(NAMESPACE, "DEF")
    from . import catalog

    specs = list(catalog.OPS)
    if CONTEXT.hook is not None:
        registry = OpRegistry()
        CONTEXT.hook.pytest_npugraph_register_ops(registry=registry)
        specs += registry.ops
    for spec in specs:
        _define(spec)


def cores_of(name: str):
    """The declared profile of custom op ``name`` (any overload), or None."""
    spec = SPECS.get(name)
    return None if spec is None else spec.cores
