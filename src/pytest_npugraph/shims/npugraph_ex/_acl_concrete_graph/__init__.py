"""``npugraph_ex._acl_concrete_graph``: the parts its users and tests import (``replace_stream_event``)."""
