#!/usr/bin/env python
"""Write ``runtime/ops/_generated.py``: every op torch_npu registers in its ``npu`` namespace.

The input is torch_npu's op table, ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`` of
the wheel (``pip download --no-deps torch-npu==2.14.0``; the file is not kept in this repository).
Its ``custom:`` section lists the ops torch_npu's codegen defines in ``TORCH_LIBRARY(npu, ...)``
and hence exports as ``torch.ops.npu.<name>`` and ``torch_npu.<name>`` (torch_npu's
``_export_npu_ops`` copies every name of ``dir(torch.ops.npu)``); the other sections
(``supported``, ``autograd``, ``quant``, ``symint``) are NPU kernels of aten ops or annotations,
not names of their own.

Usage: ``python tools/gen_op_schemas.py PATH/TO/npu_native_functions_by_codegen.yaml``
(``--check`` compares with the committed module instead of writing it).
"""
from __future__ import annotations

import argparse
import pathlib
import pprint
import sys

import yaml

OUT = pathlib.Path(__file__).resolve().parents[1] / "src/pytest_npugraph/runtime/ops/_generated.py"
FUNCTIONAL = "_functional"


def read_table(path: str) -> list:
    """``[(schema, exposed, tags)]`` of the yaml's ``custom:`` section, in its order."""
    data = yaml.safe_load(pathlib.Path(path).read_text())
    rows, seen = [], set()
    for entry in data.get("custom") or ():
        schema = " ".join(entry["func"].split())
        name = schema[:schema.index("(")]
        if name in seen:
            raise SystemExit(f"{path}: {name} is listed twice")
        seen.add(name)
        tags = entry.get("tags") or ()
        tags = tuple(t.strip() for t in tags.split(",")) if isinstance(tags, str) else tuple(tags)
        rows.append((schema, bool(entry.get("exposed")), tags))
    return rows


def render(rows: list, source: str) -> str:
    names = [s[:s.index("(")] for s, _, _ in rows]
    bases = {n.split(".", 1)[0] for n in names}
    functional = {}
    for n in names:
        base, dot, overload = n.partition(".")
        twin = base + FUNCTIONAL + dot + overload
        if twin in names:
            functional[n] = twin
    inplace = {}
    for n in names:
        base, dot, overload = n.partition(".")
        if base.endswith("_") and not base.endswith("__"):
            plain = base[:-1] + dot + overload
            if plain in names:
                inplace[plain] = n
    tags = {s[:s.index("(")]: t for s, _, t in rows if t}
    out = [
        f'"""The op names and schemas of torch_npu 2.14.0\'s ``npu`` namespace (generated; do not edit).',
        "",
        f"Written by ``tools/gen_op_schemas.py`` from {source}: every ``custom:`` entry of",
        "``npu_native_functions_by_codegen.yaml``, overloads included, with its schema verbatim.",
        f"{len(names)} overloads of {len(bases)} names, "
        f"{sum(b.startswith('npu_') for b in bases)} of them ``npu_*``.",
        '"""',
        "",
        "# Every overload's schema, in the yaml's order.",
        "SCHEMAS = (",
    ]
    out += [f"    {s!r}," for s, _, _ in rows]
    out += [")", "",
            "# Marked ``exposed: true`` (documented public API of torch_npu).",
            "EXPOSED = frozenset(" + pprint.pformat(sorted(n for (s, e, _), n in zip(rows, names) if e),
                                                    width=116, compact=True).replace("\n", "\n    ") + ")",
            "",
            "# Dispatcher tags of an overload (``nondeterministic_seeded``: random ops).",
            "TAGS = " + pprint.pformat(tags, width=116, compact=True),
            "",
            "# A mutating overload -> its out-of-place ``_functional`` twin (the Functionalize pair).",
            "FUNCTIONAL_TWINS = " + pprint.pformat(functional, width=116),
            "",
            "# An out-of-place overload -> its in-place ``name_`` variant.",
            "INPLACE_VARIANTS = " + pprint.pformat(inplace, width=116),
            ""]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("yaml", help="torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml of the wheel")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", action="store_true", help="fail if the committed module differs")
    args = parser.parse_args(argv)
    rows = read_table(args.yaml)
    text = render(rows, "torch_npu 2.14.0 (torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml)")
    out = pathlib.Path(args.out)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from the yaml'}")
        return 0 if same else 1
    out.write_text(text)
    names = [s[:s.index("(")] for s, _, _ in rows]
    bases = {n.split(".", 1)[0] for n in names}
    print(f"wrote {out}: {len(names)} overloads, {len(bases)} names, "
          f"{sum(b.startswith('npu_') for b in bases)} npu_* names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
