"""How torchair re-raises config and compile errors: the same exception type, with the traceback and
a GRAPH error-code line appended (mirrors ``_utils/error_code.py``)."""
from __future__ import annotations

import functools
import traceback


def get_error_msg(e) -> str:
    from pytest_npugraph.runtime.errors import ErrCode, graph_error

    if isinstance(e, NotImplementedError):
        code = ErrCode.NOT_SUPPORT
    elif isinstance(e, (ValueError, AssertionError)):
        code = ErrCode.PARAM
    elif isinstance(e, FileNotFoundError):
        code = ErrCode.NOT_FOUND
    else:
        code = ErrCode.INTERNAL
    return graph_error(code)


def pretty_error_msg(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as e:
            raise type(e)("\n".join([str(e), traceback.format_exc(), get_error_msg(e)]))
    return wrapper
