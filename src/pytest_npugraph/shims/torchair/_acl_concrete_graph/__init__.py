"""``torchair._acl_concrete_graph``: the parts of TorchAir's aclgraph package tests touch (its submodules are
attributes of the package once imported, as TorchAir's own imports make them)."""
from . import cat_optimization, fx2acl_converter, replace_stream_event, static_kernel  # noqa: F401
