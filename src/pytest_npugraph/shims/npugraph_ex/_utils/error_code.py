"""npugraph_ex re-raises errors as torchair does (one implementation: ``torchair._utils.error_code``)."""
from torchair._utils.error_code import get_error_msg, pretty_error_msg  # noqa: F401
