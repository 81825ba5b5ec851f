"""The tag <-> event registry of tagged events (torch >= 2.6 flavour: reverse lookup by ``id``)."""
from __future__ import annotations


class TaggedEventBidict:
    """tag -> event, and id(event) -> tag.  Emptied when a new test creates its first tagged event,
    so tags are unique per test (torchair: per process)."""

    def __init__(self):
        self.global_tag_to_event = {}
        self.global_event_id_to_tag = {}
        self.generation = None

    def __setitem__(self, tag, event):
        self.global_tag_to_event[tag] = event
        self.global_event_id_to_tag[id(event)] = tag

    def keys(self):
        return self.global_tag_to_event.keys()

    def get(self, tag: str):
        return self.global_tag_to_event.get(tag)

    def get_reverse(self, event) -> str:
        return self.global_event_id_to_tag.get(id(event))

    def start(self, generation) -> None:
        if generation != self.generation:
            self.global_tag_to_event.clear()
            self.global_event_id_to_tag.clear()
            self.generation = generation
