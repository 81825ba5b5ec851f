"""``npugraph_ex._acl_concrete_graph``: the parts its users and tests import (``replace_stream_event``,
``static_kernel``, ``cat_optimization``)."""
from . import cat_optimization, replace_stream_event, static_kernel  # noqa: F401
