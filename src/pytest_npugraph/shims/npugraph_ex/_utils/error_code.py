"""How npugraph_ex re-raises config and compile errors (mirrors ``_utils/error_code.py``): the same
exception type, the traceback and a GRAPH error-code line appended."""
from __future__ import annotations

import traceback


def get_error_msg(e) -> str:
    from pytest_npugraph.runtime.errors import ErrCode, graph_error

    code = ErrCode.INTERNAL
    if isinstance(e, NotImplementedError):
        code = ErrCode.NOT_SUPPORT
    elif isinstance(e, (ValueError, AssertionError)):
        code = ErrCode.PARAM
    elif isinstance(e, FileNotFoundError):
        code = ErrCode.NOT_FOUND
    return graph_error(code)


def pretty_error_msg(func):
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as e:
            raise type(e)("\n".join([str(e), traceback.format_exc(), get_error_msg(e)]))
    return wrapper
