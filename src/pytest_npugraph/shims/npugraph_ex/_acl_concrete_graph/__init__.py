"""``npugraph_ex._acl_concrete_graph``: the parts its users and tests import (``replace_stream_event``,
``static_kernel``, ``cat_optimization``, ``fx2acl_converter``)."""
from . import cat_optimization, fx2acl_converter, replace_stream_event, static_kernel  # noqa: F401
