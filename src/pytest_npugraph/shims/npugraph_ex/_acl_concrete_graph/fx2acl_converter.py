"""``npugraph_ex._acl_concrete_graph.fx2acl_converter``: torchair's (one implementation)."""
from torchair._acl_concrete_graph.fx2acl_converter import *  # noqa: F401,F403
from torchair._acl_concrete_graph.fx2acl_converter import __all__  # noqa: F401
