"""The thread-local stack of scope attributes that the scope-enter/exit ops of a compiled graph push
and pop when executed (``need_execute=True``).  TorchAir keeps it in ``torchair.scope._scope_attr``;
it lives in the compiler layer so a graph run can unwind what its nodes pushed when one raises, and
the ``torchair`` and ``npugraph_ex`` op kernels share one stack."""
from __future__ import annotations

import logging
import threading
from typing import Dict, List

log = logging.getLogger("torchair")
local = threading.local()


class ScopeAttrs:
    def __init__(self):
        self._attribute_stack: List[Dict[str, str]] = []

    def push(self, attributes: Dict[str, str]):
        log.debug(f"ScopeAttrs push attrs: {attributes}")
        self._attribute_stack.append(attributes)

    def pop(self):
        if self._attribute_stack:
            self._attribute_stack.pop()

    def top(self):
        return self._attribute_stack[-1] if self._attribute_stack else None

    def scope_attr_info(self):
        return self._attribute_stack


def scope_enter(keys: List[str], values: List[str]):
    if not hasattr(local, "scope_attr"):
        local.scope_attr = ScopeAttrs()
    local.scope_attr.push(dict(zip(keys, values)))


def scope_exit():
    if hasattr(local, "scope_attr"):
        local.scope_attr.pop()


def has_scope_attr():
    return hasattr(local, "scope_attr") and len(local.scope_attr.scope_attr_info()) > 0


def depth() -> int:
    return len(local.scope_attr.scope_attr_info()) if has_scope_attr() else 0


def unwind(to_depth: int) -> None:
    """Pop what a graph run pushed beyond ``to_depth`` (a node raised between enter and exit)."""
    while depth() > to_depth:
        scope_exit()
