"""Find the user's source line for a call: the first frame outside torch, pytest and this plugin."""
from __future__ import annotations

import os
import sys
import sysconfig
import weakref

from .._context import CONTEXT
from ..trace import UNKNOWN_SITE, Site

_PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# libraries between user code and the emulator (wrappers, decorators, test machinery), never "the user's line"
_LIBRARIES = ("torch", "_pytest", "pytest", "pluggy", "typing_extensions", "functorch", "hypothesis", "xdist", "execnet",
              "numpy", "networkx", "sympy")


def _excluded_prefixes() -> tuple:
    import importlib.util

    dirs = [_PLUGIN_DIR, sysconfig.get_paths()["stdlib"]]
    for name in _LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            # a package excludes its directory, a single-module library (typing_extensions) its file
            dirs.append(os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin)
    out = []
    for d in dirs:
        for form in {d, os.path.realpath(d)}:
            out.append(form if form.endswith(".py") else form + os.sep)
    return tuple(out)


_EXCLUDED = None
# file name -> path to show (relative to pytest's rootdir), or None.  By name, not code object: the
# verdict depends on the file only, and holding no code object lets Dynamo's transformed code die with
# its caches (their death deletes the ``__compiled_fn_*`` globals they installed).  Generated code
# ("<eval_with_key>.N", one name per FX module) is judged each time instead of filling the table.
_verdict: dict = {}


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
    """The innermost user frame above the caller (verdicts cached per file: cheap on hot paths)."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:      # called near the bottom of the stack (a script's top level): no user frame above
        return UNKNOWN_SITE
    return first_user(frame)


def direct_user_site(depth: int = 2):
    """The frame ``depth`` above the caller as a ``Site`` if it is user code, else None (the call came
    from torch or the plugin: a stream the emulated compiler makes is not one the user made)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    if _display(frame.f_code.co_filename) is None:
        return None
    return first_user(frame)


def caller_of_compiled(depth: int = 2) -> Site:
    """The user's line that called a ``torch.compile``d function or module, from inside its compiled
    graph: the compiled code runs in the frame of the user's ``forward``, which Dynamo's entry
    (``torch/_dynamo/eval_frame.py``) calls, so take the first user frame above the outermost Dynamo
    frame of the chain; ``user_site`` when there is none."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return UNKNOWN_SITE
    entry = None
    while frame is not None:
        if frame.f_code.co_filename.endswith(_EVAL_FRAME):
            entry = frame
        elif entry is not None and _display(frame.f_code.co_filename) is not None:
            above = frame.f_back    # the user's forward: is it itself run by Dynamo's entry?
            while above is not None and _display(above.f_code.co_filename) is None \
                    and not above.f_code.co_filename.endswith(_EVAL_FRAME):
                above = above.f_back
            if above is None or not above.f_code.co_filename.endswith(_EVAL_FRAME):
                break
        frame = frame.f_back
    return user_site(depth + 1) if entry is None else first_user(entry)


_EVAL_FRAME = os.path.join("_dynamo", "eval_frame.py")


def first_user(frame) -> Site:
    """The innermost user frame from ``frame`` outwards."""
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        shown = _verdict.get(filename, False)
        if shown is False:
            shown = _display(filename)
            if filename[:1] != "<":
                _verdict[filename] = shown
        if shown is not None:
            key = (id(code), frame.f_lasti)
            known = _sites.get(key)
            if known is not None and known[0]() is code:
                return known[1]
            if len(_sites) >= _SITES_KEPT:
                _sites.clear()
            site = Site(shown, frame.f_lineno, code.co_name)
            _sites[key] = (weakref.ref(code), site)
            return site
        frame = frame.f_back
    return UNKNOWN_SITE


# (code's id, instruction offset) -> (weak reference to the code, its Site): one Site per call site, shared
# by every record made there (``f_lineno`` decodes the line table each time; fewer objects for the GC).
# By code object, not file and line: Dynamo's transformed code and exec'd text share their file name
# with other code; weakly, so that code can die (see ``_verdict``)
_sites: dict = {}
_SITES_KEPT = 1 << 16
