"""The tag <-> event registry of tagged events (torch >= 2.6 flavour: reverse lookup by ``id``)."""
from __future__ import annotations


class TaggedEventBidict:
    """tag -> event, and id(event) -> tag.  One per test (``tagged_events()``), so tags are unique
    per test (torchair: per process)."""

    def __init__(self):
        self.global_tag_to_event = {}
        self.global_event_id_to_tag = {}

    def __setitem__(self, tag, event):
        self.global_tag_to_event[tag] = event
        self.global_event_id_to_tag[id(event)] = tag

    def keys(self):
        return self.global_tag_to_event.keys()

    def get(self, tag: str):
        return self.global_tag_to_event.get(tag)

    def get_reverse(self, event) -> str:
        return self.global_event_id_to_tag.get(id(event))


def tagged_events() -> TaggedEventBidict:
    """The running test's registry."""
    from pytest_npugraph.runtime.runtime import current

    stash = current().stash
    if stash.tag_events is None:
        stash.tag_events = TaggedEventBidict()
    return stash.tag_events
