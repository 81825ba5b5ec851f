"""The thread-local stack of scope attributes that ``air::scope_enter``/``scope_exit`` push and pop
when executed (``need_execute=True``: compiled graphs; kept in ``pytest_npugraph.compiler.scope_stack``),
and the tag -> stream registry used by ``npu_record_tagged_stream``."""
from __future__ import annotations

import threading
from torchair.core.utils import logger
from pytest_npugraph.compiler.scope_stack import (  # noqa: F401  (the stack lives in the compiler layer)
    ScopeAttrs, has_scope_attr, local, scope_enter, scope_exit)

_GLOBAL_TAGGED_STREAM_LOCK = threading.Lock()


def _tag_to_stream() -> dict:
    """torchair's ``_GLOBAL_TAG_TO_STREAM``, per test (a stream of an earlier test is not this test's)."""
    from pytest_npugraph.runtime.runtime import current

    return current().stash.tag_streams


def _npu_get_or_create_stream_with_tag(tag: str):
    """A stream per tag, made on first use (a different object from the stream an
    ``npu_stream_switch`` of the same tag runs on, as in torchair)."""
    with _GLOBAL_TAGGED_STREAM_LOCK:
        _GLOBAL_TAG_TO_STREAM = _tag_to_stream()
        stream = _GLOBAL_TAG_TO_STREAM.get(tag)
        if stream is None:
            import torch_npu

            stream = _GLOBAL_TAG_TO_STREAM[tag] = torch_npu.npu.Stream()
            logger.debug(f"create stream = {stream} with tag = {tag} successfully")
        return stream
