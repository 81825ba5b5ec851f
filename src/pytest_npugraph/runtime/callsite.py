"""Find the user's source line for a call: the first frame outside torch, pytest and this plugin."""
from __future__ import annotations

import os
import sys
import sysconfig

from .._context import CONTEXT
from ..trace import UNKNOWN_SITE, Site

_PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _excluded_prefixes() -> tuple:
    import pluggy
    import torch
    import _pytest

    dirs = [_PLUGIN_DIR, os.path.dirname(torch.__file__), os.path.dirname(_pytest.__file__),
            os.path.dirname(pluggy.__file__), sysconfig.get_paths()["stdlib"]]
    return tuple(os.path.realpath(d) + os.sep for d in dirs) + tuple(d + os.sep for d in dirs)


_EXCLUDED = None
_verdict: dict = {}   # code object -> path to show (relative to pytest's rootdir), or None


def _display(filename: str):
    global _EXCLUDED
    if _EXCLUDED is None:
        _EXCLUDED = _excluded_prefixes()
    if filename.startswith("<") and filename != "<string>":
        # frozen importlib, generated code (torch.fx "<eval_with_key>") and the like
        return None
    if filename.startswith(_EXCLUDED) or "/site-packages/pytest_npugraph/" in filename:
        return None
    try:
        rel = os.path.relpath(filename, CONTEXT.rootdir or os.getcwd())
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def user_site(depth: int = 2) -> Site:
    """The innermost user frame above the caller (cached per code object: cheap on hot paths)."""
    frame = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        shown = _verdict.get(code, False)
        if shown is False:
            shown = _display(code.co_filename)
            _verdict[code] = shown
        if shown is not None:
            return Site(shown, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return UNKNOWN_SITE
