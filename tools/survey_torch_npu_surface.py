"""Which names of the ``torch_npu`` Python surface a code base uses, and which of them the emulated
``torch_npu`` lacks.

    python tools/survey_torch_npu_surface.py SRC [SRC ...] [--missing] [--json OUT]

Every ``.py`` file under each SRC is parsed (never imported).  A *name* is a dotted path the code
reaches statically: a module it imports (``import torch_npu.profiler``, ``from torch_npu.op_plugin.atb
import _atb_ops``), a name it imports from one (``from torch_npu.npu import graphs``), or an attribute
chain read from an imported name (``torch_npu._C._NPUTaskGroupHandle``, ``torch_npu.npu.Stream.wait_stream``,
``torch.npu.graph_task_group_end``, ``torch.ops.npu.npu_rms_norm``).  ``torch.npu.*`` is
resolved on ``torch.npu`` after ``import torch_npu``, ``torch.ops.npu.*`` / ``torch.ops.atb.*`` as op
names.  A name is *missing* when the emulated package cannot resolve it by attribute access or, on
a module, by importing the submodule.  ``hasattr``/``getattr`` probes are not names: code that
probes has a fallback; an attribute the code assigns (``torch_npu.npu.config.x = v``,
``reductions._original = ...``) uses only its owner.

Printed: files scanned, files that touch the surface, distinct names and their uses, and the missing
names (``--missing`` lists them, with their use counts and a first place).  The emulation is
switched on here as the plugin does (its shims first on ``sys.path``); no test runtime is needed
because only attributes are looked up, nothing is called.
"""
from __future__ import annotations

import argparse
import ast
import collections
import importlib
import json
import os
import sys

ROOTS = ("torch_npu",)
TORCH_SUBTREES = ("torch.npu", "torch.ops.npu", "torch.ops.atb")


def _dotted(node):
    """``a.b.c`` of an Attribute/Name chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _interesting(name: str) -> bool:
    return name.split(".")[0] in ROOTS or any(name == t or name.startswith(t + ".") for t in TORCH_SUBTREES)


class _FileSurvey(ast.NodeVisitor):
    """The names one file uses: imports bind local names to dotted paths; attribute chains on
    those names are uses."""

    def __init__(self, path: str):
        self.path = path
        self.binds = {"torch": "torch"}     # local name -> dotted path it stands for
        self.uses = []                        # (dotted name, line)
        self.assigned = set()                 # dotted names the file assigns

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS or alias.name == "torch" or alias.name.startswith("torch."):
                if alias.name.split(".")[0] in ROOTS:
                    self.uses.append((alias.name, node.lineno))
                if alias.asname:
                    self.binds[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.binds[top] = top

    def visit_ImportFrom(self, node):
        module = node.module or ""
        if node.level or not module:
            return
        if module.split(".")[0] in ROOTS or module in ("torch", "torch.ops") or module.startswith("torch.npu"):
            for alias in node.names:
                if alias.name == "*":
                    continue
                full = f"{module}.{alias.name}"
                if _interesting(full):
                    self.uses.append((full, node.lineno))
                    self.binds[alias.asname or alias.name] = full

    def visit_Attribute(self, node):
        dotted = _dotted(node)
        if dotted is not None:
            head, _, rest = dotted.partition(".")
            base = self.binds.get(head)
            if base is not None:
                full = f"{base}.{rest}" if rest else base
                if not isinstance(node.ctx, ast.Load):      # ``torch.npu.config.x = v`` uses torch.npu.config
                    self.assigned.add(full)
                    full = full.rpartition(".")[0]
                if _interesting(full) and full not in TORCH_SUBTREES:
                    self.uses.append((full, node.lineno))
                return      # the whole chain is one use; its prefixes are not separate ones
        self.generic_visit(node)


def survey_files(sources):
    uses = collections.Counter()
    where = {}
    assigned = set()
    files = touching = 0
    for source in sources:
        for root, dirs, names in os.walk(source):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for name in sorted(names):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                files += 1
                try:
                    with open(path, encoding="utf-8", errors="replace") as f:
                        tree = ast.parse(f.read(), path)
                except (SyntaxError, ValueError):
                    continue
                v = _FileSurvey(path)
                v.visit(tree)
                assigned |= v.assigned
                if v.uses:
                    touching += 1
                for dotted, line in v.uses:
                    uses[dotted] += 1
                    where.setdefault(dotted, f"{os.path.relpath(path, source)}:{line}")
    for name in assigned:             # a name the code base sets itself is not the package's
        uses.pop(name, None)
    return files, touching, uses, where


def activate_emulation():
    """The plugin's own activation: the shims first on sys.path."""
    from pytest_npugraph import activation

    activation.activate()
    import torch_npu  # noqa: F401
    if not getattr(torch_npu, "_EMULATED", False):
        raise SystemExit(f"not the emulated torch_npu: {torch_npu.__file__}")


def resolves(name: str) -> bool:
    """Whether the emulated package answers ``name`` (attribute access, or importing a submodule)."""
    import torch

    parts = name.split(".")
    if parts[0] == "torch":
        if parts[1] == "ops":
            if len(parts) < 4:
                return True
            namespace = getattr(torch.ops, parts[2])
            try:
                getattr(namespace, parts[3])
            except (AttributeError, RuntimeError):
                return False
            return True
        obj, prefix, rest = torch, "torch", parts[1:]
    else:
        obj, prefix, rest = importlib.import_module(parts[0]), parts[0], parts[1:]
    for part in rest:
        prefix = f"{prefix}.{part}"
        try:
            obj = getattr(obj, part)
            continue
        except AttributeError:
            pass
        except Exception:           # a property that needs a runtime: the name exists
            return True
        if not isinstance(obj, type(sys)):
            return False
        try:
            obj = importlib.import_module(prefix)
        except ImportError:
            return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", help="folders to scan")
    parser.add_argument("--missing", action="store_true", help="list the missing names")
    parser.add_argument("--json", metavar="OUT", help="write the figures and every name's status to OUT")
    args = parser.parse_args(argv)
    files, touching, uses, where = survey_files(args.sources)
    activate_emulation()
    unresolved = {name: n for name, n in uses.items() if not resolves(name)}
    # torch.ops.npu.<op> names that torch_npu 2.14.0 does not define (all of its op names exist under
    # emulation): other packages (sgl_kernel_npu, vLLM-Ascend's csrc) register them at import
    foreign = {name: n for name, n in unresolved.items() if name.startswith(("torch.ops.npu.", "torch.ops.atb."))}
    missing = {name: n for name, n in unresolved.items() if name not in foreign}
    print(f"files scanned: {files}; files using the torch_npu surface: {touching}")
    print(f"names used: {len(uses)} ({sum(uses.values())} uses); "
          f"missing: {len(missing)} ({sum(missing.values())} uses); "
          f"ops of other packages in torch.ops.npu: {len(foreign)} ({sum(foreign.values())} uses)")
    if args.missing:
        for title, names in (("missing", missing), ("ops of other packages", foreign)):
            if names:
                print(f"{title}:")
            for name, n in sorted(names.items(), key=lambda kv: (-kv[1], kv[0])):
                print(f"  {n:4d}  {name}    ({where[name]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"files": files, "touching": touching,
                       "names": {name: {"uses": n, "first": where[name], "missing": name in missing,
                                        "other_package_op": name in foreign}
                                 for name, n in sorted(uses.items())}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
