"""How torchair re-raises config and compile errors: the same exception type, with the traceback and
a GRAPH error-code line appended (mirrors ``_utils/error_code.py``)."""
from __future__ import annotations

import functools
import os
import traceback

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep


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


def user_traceback(e) -> str:
    """``traceback.format_exc()`` as TorchAir appends it, without the emulator's frames (its compiler is
    not the user's code: a user mistake is explained in the message, with the user's line); empty when
    only emulator frames are left."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(_PACKAGE)]
    if not frames:
        return ""
    return ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
            + "".join(traceback.format_exception_only(type(e), e)))


def pretty_error_msg(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True
        try:
            return func(*args, **kwargs)
        except Exception as e:
            raise type(e)("\n".join([str(e), user_traceback(e), get_error_msg(e)]))
    return wrapper
