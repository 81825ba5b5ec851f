"""Memory facts of a trace, worked out once: which block was freed where, and which streams
``record_stream`` named before that free.

Why: the happens-before model (the allocator waits for recorded streams before it reuses an
address), the race engine (a conflict across a free is a missing ``record_stream`` unless the use's
stream was recorded) and the missing-``record_stream`` rule all ask these questions; each used to
scan the trace for them in its own way.

``record_stream`` after the block's free (or on a block never freed) is kept apart: the allocator
reads the recorded streams at the free, so only those before it count.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..trace import Free, RecordStream


@dataclass
class MemoryFacts:
    free: dict = field(default_factory=dict)        # bid -> its Free record
    free_pos: dict = field(default_factory=dict)    # bid -> position of that Free in trace.records
    recorded: dict = field(default_factory=dict)    # bid -> frozenset of sids record_stream named before the free

    def freed_before(self, bid: int, pos: int) -> bool:
        """Was block ``bid`` freed by the host before trace position ``pos``?"""
        at = self.free_pos.get(bid)
        return at is not None and at < pos

    def recorded_at_free(self, bid: int) -> frozenset:
        return self.recorded.get(bid, frozenset())


def compute(trace) -> MemoryFacts:
    facts = MemoryFacts()
    pending: dict = {}
    for pos, rec in enumerate(trace.records):
        cls = type(rec)
        if cls is RecordStream:
            if rec.block not in facts.free:
                pending.setdefault(rec.block, set()).add(rec.stream)
        elif cls is Free:
            facts.free[rec.block] = rec          # (a block is freed once; the latest free wins)
            facts.free_pos[rec.block] = pos
            facts.recorded[rec.block] = facts.recorded.get(rec.block, frozenset()) | pending.pop(rec.block, set())
    return facts

