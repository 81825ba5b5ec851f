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
    import npugraph_ex
    import npugraph_ex.inference
    import npugraph_ex.scope
    import torch_npu
    import torchair
    import torchair.experimental.inference

    out = {}
    for prefix, module, names in (
            ("torch.npu", torch.npu, torch.npu.__all__),
            ("torch_npu", torch_npu, [n for n in dir(torch_npu) if not n.startswith("_")]),
            ("torchair", torchair, torchair.__all__),
            ("torchair.ops", torchair.ops, [n for n in dir(torchair.ops) if not n.startswith("_")]),
            ("torchair.scope", torchair.scope, [n for n in dir(torchair.scope) if not n.startswith("_")]),
            ("torch_npu.distributed", torch_npu.distributed, torch_npu.distributed.__all__),
            ("torchair.inference", torchair.inference, torchair.inference.__all__),
            ("torchair.experimental.inference", torchair.experimental.inference,
             ["npu_format_cast_via_cpu", "use_internal_format_weight"]),
            ("npugraph_ex", npugraph_ex, npugraph_ex.__all__),
            ("npugraph_ex.scope", npugraph_ex.scope, ["limit_core_num", "deterministic"]),
            ("npugraph_ex.inference", npugraph_ex.inference, ["cache_compile", "readable_cache"]),
            ("torch.npu.npugraph_ex", torch.npu.npugraph_ex, ["compile_fx", "register_replacement"]),
            ("torch.npu.npugraph_ex.scope", torch.npu.npugraph_ex.scope, ["limit_core_num"])):
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


# lines that fail on a bad argument exactly where the real package's own code does (same statement,
# same Python error), each with the wheel file that has the unchecked statement
MIRRORED = {
    ("shims/npugraph_ex/configs/compiler_config.py", "for option in options:"):
        "torch_npu/dynamo/npugraph_ex/configs/compiler_config.py: _process_kwargs_options iterates options",
    ("shims/torch_npu/npu/streams.py", "event.record(self)"): "torch_npu/npu/streams.py: Stream.record_event",
    ("shims/torch_npu/npu/streams.py", "event.wait(self)"): "torch_npu/npu/streams.py: Stream.wait_event",
    ("shims/torch_npu/npu/streams.py", "self.wait_event(stream.record_event())"):
        "torch_npu/npu/streams.py: Stream.wait_stream",
    # npugraph_ex reads the config's fields when it builds the compiler (npu_fx_compiler.py: self.config.use_graph_pool)
    ("compiler/settings.py", "pool = config.use_graph_pool"): "torch_npu/dynamo/npugraph_ex/npu_fx_compiler.py",
    ("shims/torchair/inference/__init__.py", "for dim_index, gears in dim_gears.items():"):
        "torch_npu/dynamo/torchair/inference/_gear_utils.py: set_dim_gears",
    ("shims/npugraph_ex/npu_fx_compiler.py",
     "decompositions = dict({} if custom_decompositions is None else custom_decompositions)"):
        "torch_npu/dynamo/npugraph_ex/npu_fx_compiler.py: _get_merged_decompositions (dict.update)",
    # cache_compile reads the backend's keywords unchecked (a backend is a functools.partial)
    ("shims/torchair/inference/__init__.py", 'if backend.keywords.get("compiler_config") != config:'):
        "torch_npu/dynamo/torchair/inference/_cache_compiler.py: cache_compile",
    ("shims/torchair/inference/__init__.py", 'config = backend.keywords.get("compiler_config")'):
        "torch_npu/dynamo/torchair/inference/_cache_compiler.py: cache_compile",
    # dynamo_export sets the config's export fields and reads the model's weights unchecked
    ("shims/torchair/npu_export.py", "config.export.export_mode = True"):
        "torch_npu/dynamo/torchair/npu_export.py: _get_export_config",
    ("shims/torchair/npu_export.py", "for name, p in model.named_buffers():"):
        "torch_npu/dynamo/torchair/npu_export.py: _get_model_weight_names",
}


def internal_error(exc):
    """A description if ``exc`` came from inside pytest-npugraph by accident (a Python bug-type error
    whose raising frame is ours and is not a ``raise``/``assert`` statement), else None."""
    filename, lineno = raising_frame(exc)
    if not os.path.abspath(filename).startswith(PACKAGE) or filename in BOUNDARY:
        return None
    line = linecache.getline(filename, lineno).strip()
    if line.startswith(("raise", "assert")):
        return None
    if (os.path.relpath(filename, PACKAGE), line) in MIRRORED:
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


def public_methods(npugraph):
    """(qualified name, bound method) for the methods users call on the emulated objects and on the
    ``npugraph`` fixture (made fresh per test: ``npugraph`` is the running test's fixture)."""
    import torch

    objects = {"torch.npu.Stream()": torch.npu.Stream(), "torch.npu.Event()": torch.npu.Event(enable_timing=True),
               "torch.npu.NPUGraph()": torch.npu.NPUGraph(), "npugraph": npugraph}
    out = []
    for owner, obj in objects.items():
        for name in sorted(dir(type(obj))):
            if name.startswith("_"):
                continue
            attr = getattr(type(obj), name, None)
            if isinstance(attr, property) or not callable(attr):
                continue
            out.append((f"{owner}.{name}", getattr(obj, name)))
    return out


def config_leaves(config, prefix="config"):
    """(dotted path, group, field) of every option of a torchair / npugraph_ex ``CompilerConfig``."""
    out = []
    for name in getattr(config, "_fixed_attrs", ()):
        value = getattr(config, name)
        if hasattr(value, "_fixed_attrs"):
            out.extend(config_leaves(value, f"{prefix}.{name}"))
        else:
            out.append((f"{prefix}.{name}", config, name))
    return out


# the texts of TorchAir's / npugraph_ex's option classes (configs/_option_base.py in the wheel)
OPTION_ERRORS = (
    (ValueError, r"^Value .* \(type: <class '.*'>\) not in optional list .* \(type: .*\)\.$"),
    (ValueError, r"^Please set integer type, but got <class '.*'>$"),
    (ValueError, r"^Please set value in \[-?\d+, \d+\], -?\d+ is out of range\.$"),
    (TypeError, r"^the set value must be None or list, got <class '.*'>$"),
    (TypeError, r"^the set value must be int list, got list type: \[.*\]$"),
    (TypeError, r"^value must be (str|dict|Callable) or None, got <class '.*'>$"),
    (FileNotFoundError, r"^Please set legal (file|dir) path, .* is not found or is not .*!$"),
    (ValueError, r"^File path cannot be empty!$"),
    (ValueError, r"^Please set legal regex value format match .*, .* is Illegal format, correct example:.*\.$"),
    # os.path.exists / isdir on a non-path, as the real path options call them
    (TypeError, r"^(expected str, bytes or os\.PathLike object|stat: path should be string, bytes, os\.PathLike "
                r"or integer), not \w+$"),
    (OverflowError, r"^fd is greater than maximum$"),
    (TypeError, r"^expected string or bytes-like object, got '\w+'$"),
    # a file option given an open file descriptor number (True == fd 1 exists): the real check then calls
    # v.endswith(".json") on it
    (AttributeError, r"^'(bool|int)' object has no attribute 'endswith'$"),      # re.match(<regex>, <non-str>)
    (ValueError, r"^(negative file descriptor|embedded null (byte|character) in path)$"),
)
