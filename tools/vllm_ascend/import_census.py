#!/usr/bin/env python
"""How many of vLLM-Ascend's modules import under the plugin's emulated NPU, and why the others do not.

Usage: ``python tools/vllm_ascend/import_census.py SRC_DIR [--only ops,attention,...] [--all] [-v]``

``SRC_DIR`` holds vLLM-Ascend's ``vllm_ascend/`` package (set up with ``tools/vllm_ascend/setup.sh``, whose
venv must be the one running this).  Every module of the package (``vllm_ascend`` itself, then each ``.py``
below it; by default those under ops, quantization, attention and worker, in that order, ``--only`` names other
subpackages, ``--all`` takes every module, ops first) is imported
in one pytest session with the plugin active, as a test suite would import them.  The order is vLLM-Ascend's
own: its platform registers the ops before vLLM loads a quantization config, an attention backend and the
worker (importing ``attention.attention_v1`` first fails on a circular import through ``device.device_op`` and
``ops``, on a real NPU too).  Printed: ``N of M import``
per subpackage and in all, then the failures grouped by their exception line (the first ``ModuleNotFoundError``
/ ``ImportError`` / ``AttributeError`` text), each with its modules.  Exit status 0.
"""
from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve()


def modules(src: pathlib.Path, only) -> list:
    """The package, then its modules subpackage by subpackage in ``only``'s order (every subpackage, ops first,
    when ``only`` is empty), each subpackage's in name order."""
    root = src / "vllm_ascend"
    names = ["vllm_ascend"]
    order = {name: i for i, name in enumerate(only or ["ops"])}
    paths = sorted(root.rglob("*.py"), key=lambda p: (order.get(p.relative_to(root).parts[0], len(order)),
                                                      str(p.relative_to(root))))
    for path in paths:
        rel = path.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name == "vllm_ascend" or (only and (len(parts) < 2 or parts[1] not in only)):
            continue
        names.append(name)
    return names


class _Collect:
    """Records each module's outcome from the session's reports."""

    def __init__(self):
        self.outcomes: dict = {}

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        name = report.nodeid.split("[", 1)[1][:-1]
        cause = None
        if report.failed:
            cause = _cause(report.longreprtext)
        self.outcomes[name] = cause


def _cause(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("E ") and any(k in line for k in ("Error", "Exception")):
            return line[1:].strip()[:200]
    return text.strip().splitlines()[-1][:200] if text.strip() else "unknown"


def test_import(module_name):
    import importlib

    importlib.import_module(module_name)


def pytest_generate_tests(metafunc):
    if "module_name" in metafunc.fixturenames:
        metafunc.parametrize("module_name", metafunc.config._census_modules, ids=str)


class _Params:
    def __init__(self, names):
        self.names = names

    def pytest_configure(self, config):
        config._census_modules = self.names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src")
    parser.add_argument("--only", default="ops,quantization,attention,worker",
                        help="comma-separated subpackages, imported in this order (default: "
                             "ops,quantization,attention,worker)")
    parser.add_argument("--all", action="store_true", help="every module of the package")
    parser.add_argument("-v", action="store_true", help="list every module with its outcome")
    args = parser.parse_args(argv)
    src = pathlib.Path(args.src).resolve()
    only = set() if args.all else {p for p in args.only.split(",") if p}
    names = modules(src, only)
    sys.path.insert(0, str(src))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
    collect = _Collect()
    pytest.main([str(HERE), "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "--no-header", "-o",
                 "python_files=import_census.py", "--tb=short", "-W", "ignore", "--capture=sys", "-rN",
                 "--rootdir", str(HERE.parent)],
                plugins=[_Params(names), collect])
    by_group = collections.defaultdict(lambda: [0, 0])
    causes = collections.defaultdict(list)
    for name in names:
        cause = collect.outcomes.get(name, "not run")
        group = name.split(".")[1] if "." in name else "(package)"
        by_group[group][1] += 1
        if cause is None:
            by_group[group][0] += 1
        else:
            causes[cause].append(name)
        if args.v:
            print(f"{'ok  ' if cause is None else 'FAIL'} {name}" + ("" if cause is None else f"  {cause}"))
    ok = sum(g[0] for g in by_group.values())
    print(f"\nvllm_ascend modules importing under pytest-npugraph: {ok} of {len(names)}")
    for group, (n, m) in sorted(by_group.items()):
        print(f"  {group:<28} {n:>4} of {m:<4}")
    if causes:
        print("\nfailures by cause:")
        for cause, mods in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(mods):>3}  {cause}")
            for m in mods[:6]:
                print(f"         {m}")
            if len(mods) > 6:
                print(f"         ... and {len(mods) - 6} more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
