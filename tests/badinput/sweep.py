"""The public emulated callables and the judgement "was this error raised deliberately?"."""
from __future__ import annotations

import inspect
import linecache
import os

import pytest_npugraph

PACKAGE = os.path.dirname(os.path.abspath(pytest_npugraph.__file__))
# the binding-conversion module raises through operator.index, exactly as CPython's PyArg does
BOUNDARY = (os.path.join(PACKAGE, "shims", "torch_npu", "_args.py"),)
BAD_VALUES = ("x", 4.5, [1], None, -7, 2 ** 70, object())


def public_callables():
    """(qualified name, callable) for torch.npu's ``__all__``, torch_npu's and torchair's public API,
    torchair.ops / torchair.scope and torch_npu.distributed."""
    import torch
    import torch_npu
    import torchair

    out = {}
    for prefix, module, names in (
            ("torch.npu", torch.npu, torch.npu.__all__),
            ("torch_npu", torch_npu, [n for n in dir(torch_npu) if not n.startswith("_")]),
            ("torchair", torchair, torchair.__all__),
            ("torchair.ops", torchair.ops, [n for n in dir(torchair.ops) if not n.startswith("_")]),
            ("torchair.scope", torchair.scope, [n for n in dir(torchair.scope) if not n.startswith("_")]),
            ("torch_npu.distributed", torch_npu.distributed, torch_npu.distributed.__all__)):
        for name in names:
            obj = getattr(module, name, None)
            if callable(obj) and not inspect.ismodule(obj) and obj is not torch:
                out.setdefault(f"{prefix}.{name}", obj)
    return sorted(out.items())


def raising_frame(exc):
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename, tb.tb_lineno


# what Python raises for a bug, not for a checked argument (torch's own argument errors, raised by a
# torch function our code calls as the real torch_npu does, are RuntimeError/TypeError/ValueError with
# torch's texts and are not these)
_BUG_TYPES = (AttributeError, KeyError, IndexError, StopIteration, NameError, UnboundLocalError,
              ZeroDivisionError, RecursionError)
_BUG_TEXTS = ("unsupported operand type", "not subscriptable", "object is not callable", "is not iterable",
              "not supported between instances", "object of type", "can only concatenate", "argument of type",
              "values to unpack", "has no len()", "must be str, not", "object is not an iterator")


def internal_error(exc):
    """A description if ``exc`` came from inside pytest-npugraph by accident (a Python bug-type error
    whose raising frame is ours and is not a ``raise``/``assert`` statement), else None."""
    filename, lineno = raising_frame(exc)
    if not os.path.abspath(filename).startswith(PACKAGE) or filename in BOUNDARY:
        return None
    line = linecache.getline(filename, lineno).strip()
    if line.startswith(("raise", "assert")):
        return None
    text = str(exc).splitlines()[0] if str(exc) else ""
    if not isinstance(exc, _BUG_TYPES) and not any(t in text for t in _BUG_TEXTS):
        return None
    return f"{type(exc).__name__}: {text[:200]} at {os.path.relpath(filename, PACKAGE)}:{lineno}: {line}"


def calls(fn, bad):
    """Argument sets for ``fn`` with ``bad`` in every required parameter, then in each optional one."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [((bad,), {})]
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p for p in params if p.default is p.empty]
    base_args = tuple(bad for p in required if p.kind != p.KEYWORD_ONLY)
    base_kwargs = {p.name: bad for p in required if p.kind == p.KEYWORD_ONLY}
    out = [(base_args, base_kwargs)] if required else [((bad,), {})]
    for p in params:
        if p.default is not p.empty:
            out.append((base_args, dict(base_kwargs, **{p.name: bad})))
    return out
