"""``npugraph_ex::scope_enter``/``scope_exit`` (same schemas and kernels as the ``air`` ops; the
executed attributes share the compiler's scope stack) and the core-limit marker that
``replace_stream_event_pass`` resolves to a scope naming the limited stream."""
from typing import List

import torch
from torch.fx.node import has_side_effect

from pytest_npugraph.compiler.scope_stack import scope_enter, scope_exit
from npugraph_ex.ops._lib import lib

_KEYS = ("Meta", "CPU", "PrivateUse1", "BackendSelect")

if not hasattr(torch.ops.npugraph_ex, "scope_enter"):
    lib.define("scope_enter(str[] keys, str[] values, bool need_execute=False) -> None")
    has_side_effect(torch.ops.npugraph_ex.scope_enter.default)

    def _enter_kernel(keys: List[str], values: List[str], need_execute=False):
        if need_execute:
            scope_enter(keys, values)

    for _key in _KEYS:
        torch.library.impl(lib, "scope_enter", _key)(_enter_kernel)

if not hasattr(torch.ops.npugraph_ex, "scope_exit"):
    lib.define("scope_exit(bool need_execute=False) -> None")
    has_side_effect(torch.ops.npugraph_ex.scope_exit.default)

    def _exit_kernel(need_execute=False):
        if need_execute:
            scope_exit()

    for _key in _KEYS:
        torch.library.impl(lib, "scope_exit", _key)(_exit_kernel)


@torch.compiler.allow_in_graph
def _core_limit_scope_enter(stream, keys, values):
    return torch.ops.npugraph_ex.scope_enter(keys, values)


_core_limit_scope_enter._is_core_limit_scope_marker = True
has_side_effect(_core_limit_scope_enter)


def _npu_scope_enter(attrs):
    keys, values = zip(*attrs)
    return torch.ops.npugraph_ex.scope_enter(list(keys), list(values))


def _npu_core_limit_scope_enter(stream, attrs):
    keys, values = zip(*attrs)
    return _core_limit_scope_enter(stream, list(keys), list(values))


def _npu_scope_exit():
    return torch.ops.npugraph_ex.scope_exit()
