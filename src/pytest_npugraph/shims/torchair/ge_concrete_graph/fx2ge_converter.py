from torchair._ge_concrete_graph.fx2ge_converter import declare_supported, register_fx_node_ge_converter  # noqa: F401
from ._compat import warn

warn()
