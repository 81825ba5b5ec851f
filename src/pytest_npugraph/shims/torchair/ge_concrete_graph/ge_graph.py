from torchair.ge._ge_graph import (  # noqa: F401
    DataType, Tensor, TensorSpec, auto_convert_to_tensor, compat_as_bytes, compat_as_bytes_list, get_default_ge_graph,
    get_invalid_desc, next_unique_name)
from ._compat import warn

warn()
