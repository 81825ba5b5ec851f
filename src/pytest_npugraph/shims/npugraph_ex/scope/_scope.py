"""``npugraph_ex::scope_enter``/``scope_exit``: torchair's scope ops (``torchair.scope._scope``, one
stack of executed attributes) in npugraph_ex's namespace, and the core-limit marker that
``replace_stream_event_pass`` resolves to a scope naming the limited stream."""
import torch
from torch.fx.node import has_side_effect

from torchair.scope._scope import _Scope, define_scope_ops  # noqa: F401
from npugraph_ex.ops._lib import lib

define_scope_ops(lib, "npugraph_ex")


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
