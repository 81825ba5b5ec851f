"""``air::scope_enter``/``air::scope_exit``: ops with side effects, so Dynamo and AOTAutograd keep
them in the graph; their kernels do nothing unless a compiled graph executes them.  npugraph_ex has
the same ops in its namespace (``define_scope_ops``)."""
from typing import List

import torch
from torch.fx.node import has_side_effect

from ._lib import lib
from ._scope_attr import scope_enter, scope_exit

_KEYS = ("Meta", "CPU", "PrivateUse1", "BackendSelect")


def _enter_kernel(keys: List[str], values: List[str], need_execute=False):
    if need_execute:
        scope_enter(keys, values)


def _exit_kernel(need_execute=False):
    if need_execute:
        scope_exit()


def define_scope_ops(lib, namespace: str) -> None:
    ops = getattr(torch.ops, namespace)
    if not hasattr(ops, "scope_enter"):
        lib.define("scope_enter(str[] keys, str[] values, bool need_execute=False) -> None")
        has_side_effect(ops.scope_enter.default)
        for key in _KEYS:
            torch.library.impl(lib, "scope_enter", key)(_enter_kernel)
    if not hasattr(ops, "scope_exit"):
        lib.define("scope_exit(bool need_execute=False) -> None")
        has_side_effect(ops.scope_exit.default)
        for key in _KEYS:
            torch.library.impl(lib, "scope_exit", key)(_exit_kernel)


define_scope_ops(lib, "air")


class _Scope:
    """``with scope(attrs):`` -> ``<namespace>::scope_enter(keys, values)`` ... ``scope_exit()``."""

    def __init__(self, attrs, namespace: str = "air"):
        self.attrs = attrs
        self.namespace = namespace

    def __enter__(self):
        return _npu_scope_enter(self.attrs, self.namespace)

    def __exit__(self, *args):
        return _npu_scope_exit(self.namespace)


def _npu_scope_enter(attrs, namespace: str = "air"):
    keys, values = zip(*attrs)
    return getattr(torch.ops, namespace).scope_enter(list(keys), list(values))


def _npu_scope_exit(namespace: str = "air"):
    return getattr(torch.ops, namespace).scope_exit()
