"""``npugraph_ex._acl_concrete_graph.cat_optimization``: torchair's (one implementation)."""
from torchair._acl_concrete_graph.cat_optimization import *  # noqa: F401,F403
from torchair._acl_concrete_graph.cat_optimization import __all__  # noqa: F401
