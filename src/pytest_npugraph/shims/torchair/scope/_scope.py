"""``air::scope_enter``/``air::scope_exit``: ops with side effects, so Dynamo and AOTAutograd keep
them in the graph; their kernels do nothing unless a compiled graph executes them."""
from typing import List

import torch
from torch.fx.node import has_side_effect

from ._lib import lib
from ._scope_attr import scope_enter, scope_exit

_KEYS = ("Meta", "CPU", "PrivateUse1", "BackendSelect")

if not hasattr(torch.ops.air, "scope_enter"):
    lib.define("scope_enter(str[] keys, str[] values, bool need_execute=False) -> None")
    has_side_effect(torch.ops.air.scope_enter.default)

    def _enter_kernel(keys: List[str], values: List[str], need_execute=False):
        if need_execute:
            scope_enter(keys, values)

    for _key in _KEYS:
        torch.library.impl(lib, "scope_enter", _key)(_enter_kernel)


if not hasattr(torch.ops.air, "scope_exit"):
    lib.define("scope_exit(bool need_execute=False) -> None")
    has_side_effect(torch.ops.air.scope_exit.default)

    def _exit_kernel(need_execute=False):
        if need_execute:
            scope_exit()

    for _key in _KEYS:
        torch.library.impl(lib, "scope_exit", _key)(_exit_kernel)


def _npu_scope_enter(attrs):
    keys, values = zip(*attrs)
    return torch.ops.air.scope_enter(list(keys), list(values))


def _npu_scope_exit():
    return torch.ops.air.scope_exit()
