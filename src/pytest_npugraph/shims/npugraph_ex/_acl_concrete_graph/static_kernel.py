"""``npugraph_ex._acl_concrete_graph.static_kernel``: torchair's (one implementation)."""
from torchair._acl_concrete_graph.static_kernel import *  # noqa: F401,F403
from torchair._acl_concrete_graph.static_kernel import __all__  # noqa: F401
