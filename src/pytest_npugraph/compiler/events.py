"""Events TorchAir makes itself (fork/join of stream scopes: ``created_inside=True``), by tag.

TorchAir keeps them in a process-global dict filled when a graph is compiled and re-created when its
generated module first runs; here the table belongs to the running test, and a compiled graph
re-creates its events the first time it runs in a test."""
from __future__ import annotations

from ..runtime.runtime import current


def _table() -> dict:
    return current().extensions.setdefault("torchair.internal_events", {})


def create_internal_event(tag: str):
    import torch

    table = _table()
    if tag not in table:
        table[tag] = torch.npu.Event()
    return table[tag]


def internal_event(tag: str):
    return _table().get(tag)
