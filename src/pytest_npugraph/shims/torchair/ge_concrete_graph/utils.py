from torchair._ge_concrete_graph.utils import dtype_promote  # noqa: F401
from ._compat import warn

warn()
