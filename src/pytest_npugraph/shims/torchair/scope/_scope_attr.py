"""The thread-local stack of scope attributes that ``air::scope_enter``/``scope_exit`` push and pop
when executed (``need_execute=True``: compiled graphs), and the tag -> stream registry used by
``npu_record_tagged_stream``."""
from __future__ import annotations

import threading
from typing import Dict, List

from torchair.core.utils import logger

local = threading.local()


class ScopeAttrs:
    def __init__(self):
        self._attribute_stack: List[Dict[str, str]] = []

    def push(self, attributes: Dict[str, str]):
        logger.debug(f"ScopeAttrs push attrs: {attributes}")
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


_GLOBAL_TAG_TO_STREAM = {}
_GLOBAL_TAGGED_STREAM_LOCK = threading.Lock()


def _npu_get_or_create_stream_with_tag(tag: str):
    """A stream per tag, made on first use (a different object from the stream an
    ``npu_stream_switch`` of the same tag runs on, as in torchair)."""
    with _GLOBAL_TAGGED_STREAM_LOCK:
        stream = _GLOBAL_TAG_TO_STREAM.get(tag)
        if stream is None:
            import torch_npu

            stream = _GLOBAL_TAG_TO_STREAM[tag] = torch_npu.npu.Stream()
            logger.debug(f"create stream = {stream} with tag = {tag} successfully")
        return stream
