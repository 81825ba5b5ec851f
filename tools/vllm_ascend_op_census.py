#!/usr/bin/env python
"""Which torch_npu ops vLLM-Ascend calls, in how many places, and which of them the emulator has math for.

A "place" is one occurrence of ``torch_npu.<op>``, ``torch_npu.atb.<op>``, ``torch.ops.npu.<op>`` or
``torch.ops.atb.<op>`` in a ``.py`` file under ``SRC_DIR/vllm_ascend`` (the package, not its tests), comment
lines left out.
Each op is looked up in the emulator's op table (``runtime/ops/registry.table()``): ``math`` (a family
spec with CPU math), ``schema`` (the op exists, calling it raises the "no CPU implementation" error) or
``unknown`` (not an op of torch_npu 2.14.0's ``npu``/``atb`` namespaces: a Python-level API or a typo).

Usage::

    python tools/vllm_ascend_op_census.py SRC_DIR [--git-rev REV] [--missing] [--min N]

``SRC_DIR``: an unpacked vLLM-Ascend source tree (the sdist, or a checkout); with ``--git-rev`` a bare
or normal git repository and the revision to read (e.g. ``v0.23.0``), read with ``git grep``.
``--missing`` lists only the ops without math; ``--min N`` only ops with at least N places.
The exit status is 1 when an op called in more than one place has no math (0 otherwise).
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import re
import subprocess
import sys

PATTERN = re.compile(r"\b(?:torch_npu(?:\.atb)?|torch\.ops\.(?:npu|atb))\.(_?npu_\w+)")


def _sources(src: str, rev: str | None):
    """The text of every ``vllm_ascend/**.py`` file of the tree (or of the revision)."""
    if rev is None:
        root = pathlib.Path(src) / "vllm_ascend"
        if not root.is_dir():
            raise SystemExit(f"{src}: no vllm_ascend/ package directory here")
        for path in sorted(root.rglob("*.py")):
            yield str(path.relative_to(src)), path.read_text(errors="replace")
        return
    names = subprocess.run(["git", "-C", src, "ls-tree", "-r", "--name-only", rev, "--", "vllm_ascend"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith(".py"):
            yield name, subprocess.run(["git", "-C", src, "show", f"{rev}:{name}"], check=True,
                                       capture_output=True, text=True).stdout


def census(src: str, rev: str | None = None) -> "collections.Counter[str]":
    """``{op name: number of places}`` over vLLM-Ascend's package sources."""
    counts: collections.Counter = collections.Counter()
    for _, text in _sources(src, rev):
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        counts.update(PATTERN.findall(code))
    return counts


def status(names) -> dict:
    """``{op: "math" | "schema" | "unknown"}`` from the emulator's op table."""
    from pytest_npugraph.runtime.ops import registry

    table = registry.table()
    with_math = {spec.base for spec in table.values() if spec.impl is not None}
    known = {spec.base for spec in table.values()}
    return {n: "math" if n in with_math else "schema" if n in known else "unknown" for n in names}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src")
    parser.add_argument("--git-rev", default=None)
    parser.add_argument("--missing", action="store_true")
    parser.add_argument("--min", type=int, default=1)
    args = parser.parse_args(argv)
    counts = census(args.src, args.git_rev)
    states = status(counts)
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    print(f"{'places':>6}  {'state':<7} op")
    for name, n in rows:
        if n >= args.min and not (args.missing and states[name] == "math"):
            print(f"{n:>6}  {states[name]:<7} {name}")
    by_state = collections.Counter(states.values())
    places = collections.Counter()
    for name, n in counts.items():
        places[states[name]] += n
    print(f"\n{len(counts)} ops in {sum(counts.values())} places: "
          + ", ".join(f"{by_state[s]} {s} ({places[s]} places)" for s in ("math", "schema", "unknown")))
    gaps = [name for name, n in rows if n > 1 and states[name] != "math"]
    if gaps:
        print(f"called in more than one place without math: {', '.join(gaps)}")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
