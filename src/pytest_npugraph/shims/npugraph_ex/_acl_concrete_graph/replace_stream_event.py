"""``npugraph_ex._acl_concrete_graph.replace_stream_event``: torchair's (one implementation), with the
stream scopes in npugraph_ex's namespace."""
from torchair._acl_concrete_graph.replace_stream_event import GraphCounter, scoped_replace_stream_event_pass

__all__ = ["GraphCounter", "replace_stream_event_pass"]


def replace_stream_event_pass(gm):
    return scoped_replace_stream_event_pass(gm, "npugraph_ex")
