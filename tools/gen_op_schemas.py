#!/usr/bin/env python
"""Write ``runtime/ops/_generated.py``: every op torch_npu registers in its ``npu`` and ``atb`` namespaces.

The input is torch_npu's op table, ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`` of
the wheel (``pip download --no-deps torch-npu==2.14.0``; the file is not kept in this repository).
Its ``custom:`` section lists the ops torch_npu's codegen defines in ``TORCH_LIBRARY(npu, ...)``
and hence exports as ``torch.ops.npu.<name>`` and ``torch_npu.<name>`` (torch_npu's
``_export_npu_ops`` copies every name of ``dir(torch.ops.npu)``); the other sections
(``supported``, ``autograd``, ``quant``, ``symint``) are NPU kernels of aten ops or annotations,
not names of their own.

The ATB ops (``torch.ops.atb``) are not in that yaml: ``torch_npu/lib/libop_plugin_atb.so`` defines
them in its ``TORCH_LIBRARY(atb, ...)``, and ``torch_npu/op_plugin/atb/_atb_ops.py`` lists which
names torch_npu exports as ``torch_npu.<name>`` (``API_LIST``) and as ``torch_npu.atb.<name>``
(``ATB_API_LIST``).  The library keeps some schemas as C strings (read off its ``.rodata``
sections) and builds the others in code from 16-byte pieces, so those are put together again from
the library's disassembly (``objdump``, from binutils): the bytes each ``new``-ed buffer receives
(``movups`` of a piece loaded from ``.rodata``, ``mov`` of an immediate) up to the terminating
``NUL``.  Every schema found must parse (``torch._C.parse_schema``) and every listed name must have
one, or the generator stops.

Usage: ``python tools/gen_op_schemas.py PATH/TO/torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``
(the ATB files are found in the same unpacked ``torch_npu`` package; ``--atb-lib``/``--atb-api``
name them elsewhere; ``--check`` compares with the committed module instead of writing it).
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import pprint
import re
import shutil
import struct
import subprocess
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


# ------------------------------------------------------------------------------------ ATB ops
_SCHEMA = re.compile(r"^[A-Za-z_]\w*(?:\.\w+)?\(.*\) -> .+$")


def _sections(blob: bytes) -> dict:
    """``{name: (address, file offset, size)}`` of an ELF64 little-endian shared object."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise SystemExit("libop_plugin_atb.so: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset):
        return blob[names_at + offset:blob.index(b"\0", names_at + offset)].decode()
    return {name(h[0]): (h[3], h[4], h[5]) for h in headers}


def _rodata(blob: bytes, sections: dict) -> list:
    return [(address, offset, size) for name, (address, offset, size) in sections.items()
            if name.startswith(".rodata")]


def _stored_schemas(blob: bytes, sections: dict) -> list:
    """The schemas kept whole as C strings (in the string sections, not the 16-byte pieces of ``.cst16``)."""
    found = []
    for name, (_, offset, size) in sections.items():
        if name.startswith(".rodata") and not name.startswith(".rodata.cst"):
            for raw in blob[offset:offset + size].split(b"\0"):
                text = raw.decode("ascii", "replace")
                if _SCHEMA.match(text):
                    found.append(text)
    return found


_INSN = re.compile(r"^\s*[0-9a-f]+:\s+(\S+)\s*(.*?)\s*(?:#\s*([0-9a-f]+)\b.*)?$")
_MEMORY = re.compile(r"(QWORD|DWORD|WORD|BYTE|XMMWORD) PTR \[(\w+)(?:\+(0x[0-9a-f]+))?\]$")
_WIDTH = {"QWORD": 8, "DWORD": 4, "WORD": 2, "BYTE": 1, "XMMWORD": 16}
_GP = {}
for _r in "abcd":
    _GP.update({f"r{_r}x": f"r{_r}x", f"e{_r}x": f"r{_r}x", f"{_r}x": f"r{_r}x", f"{_r}l": f"r{_r}x"})
for _r in ("si", "di", "bp", "sp"):
    _GP.update({f"r{_r}": f"r{_r}", f"e{_r}": f"r{_r}", _r: f"r{_r}", f"{_r}l": f"r{_r}"})
for _i in range(8, 16):
    _GP.update({f"r{_i}": f"r{_i}", f"r{_i}d": f"r{_i}", f"r{_i}w": f"r{_i}", f"r{_i}b": f"r{_i}"})


def _built_strings(path: str, blob: bytes, sections: dict) -> list:
    """The strings the code writes into heap buffers: for each base register, the bytes stored at
    ``[reg+offset]`` (16-byte pieces loaded from ``.rodata``, immediates) up to the ``NUL`` it writes,
    taken when the string ends (a call of the schema parser, a jump, the base register changing)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        raise SystemExit("objdump (binutils) is needed to read the ATB schemas the library builds in code")
    asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-M", "intel", path], capture_output=True,
                         text=True, check=True).stdout
    rodata = _rodata(blob, sections)

    def constant(address: int):
        for start, offset, size in rodata:
            if start <= address and address + 16 <= start + size:
                return blob[offset + address - start:offset + address - start + 16]
        return None

    xmm, registers, buffers, ends, found = {}, {}, {}, {}, []

    def store(base, offset, value):
        if value is not None and base not in ("rsp", "rip"):
            buffer = buffers.setdefault(base, {})
            for i, byte in enumerate(value):
                buffer[offset + i] = byte

    def flush(base):
        """The string written through ``base`` ends here (a call, a jump, or ``base`` changes)."""
        buffer, n = buffers.pop(base, None), ends.pop(base, None)
        if buffer and n and all(i in buffer for i in range(n)):
            found.append(bytes(buffer[i] for i in range(n)))

    for line in asm.splitlines():
        m = _INSN.match(line)
        if not m:
            continue
        op, operands, target = m.groups()
        if op == "call" or op == "ret" or op.startswith("j"):
            for base in list(buffers):
                flush(base)
            ends.clear()
            if op == "call":
                xmm.clear()
                registers.clear()
            continue
        args = [a.strip() for a in operands.split(",", 1)] if operands else []
        if len(args) != 2:
            continue
        dst, src = args
        memory = _MEMORY.match(dst)
        if op in ("movdqa", "movdqu", "movaps", "movups") and dst.startswith("xmm"):
            xmm[dst] = constant(int(target, 16)) if "rip" in src and target else None
        elif op == "movups" and memory and src.startswith("xmm"):
            store(memory.group(2), int(memory.group(3) or "0", 16), xmm.get(src))
        elif op in ("mov", "movabs") and memory:
            width, base, offset = _WIDTH[memory.group(1)], memory.group(2), int(memory.group(3) or "0", 16)
            if re.fullmatch(r"0x[0-9a-f]+|\d+", src):
                value = int(src, 0).to_bytes(8, "little")[:width]
            else:
                known = registers.get(_GP.get(src))
                value = known.to_bytes(8, "little")[:width] if known is not None else None
            if width == 1 and value == b"\0":
                ends[base] = offset
            else:
                store(base, offset, value)
        elif dst in _GP and op not in ("cmp", "test"):
            if op in ("mov", "movabs") and re.fullmatch(r"0x[0-9a-f]+|\d+", src):
                registers[_GP[dst]] = int(src, 0)
            else:
                registers.pop(_GP[dst], None)
            flush(_GP[dst])
    schemas = []
    for raw in found:
        text = raw.decode("ascii", "replace")
        if _SCHEMA.match(text):
            schemas.append(text)
    return schemas


def _atb_api(path: str) -> tuple:
    """``(API_LIST, ATB_API_LIST)`` of torch_npu/op_plugin/atb/_atb_ops.py."""
    lists = {}
    for node in ast.parse(pathlib.Path(path).read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("API_LIST", "ATB_API_LIST"):
                lists[node.targets[0].id] = tuple(ast.literal_eval(node.value))
    if set(lists) != {"API_LIST", "ATB_API_LIST"}:
        raise SystemExit(f"{path}: API_LIST and ATB_API_LIST not found")
    return lists["API_LIST"], lists["ATB_API_LIST"]


def read_atb(lib: str, api: str) -> tuple:
    """``(schemas sorted by name, names exported as torch_npu.<name>, names exported as
    torch_npu.atb.<name>)`` of torch_npu's ATB ops."""
    import torch

    blob = pathlib.Path(lib).read_bytes()
    sections = _sections(blob)
    by_name = {}
    for schema in _stored_schemas(blob, sections) + _built_strings(lib, blob, sections):
        try:
            torch._C.parse_schema(f"atb::{schema}")
        except RuntimeError as exc:
            raise SystemExit(f"{lib}: {schema!r} does not parse: {exc}")
        name = schema[:schema.index("(")]
        if by_name.setdefault(name, schema) != schema:
            raise SystemExit(f"{lib}: two schemas for {name}: {by_name[name]!r} and {schema!r}")
    top, module = _atb_api(api)
    bases = {name.split(".", 1)[0] for name in by_name}
    missing = sorted(set(top + module) - bases)
    if missing:
        raise SystemExit(f"{lib}: no schema found for {missing}")
    return tuple(by_name[name] for name in sorted(by_name)), top, module


def render(rows: list, source: str, atb: tuple = ((), (), ()), atb_source: str = "") -> str:
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
        f'"""The op names and schemas of torch_npu 2.14.0\'s ``npu`` and ``atb`` namespaces (generated; do not edit).',
        "",
        f"Written by ``tools/gen_op_schemas.py`` from {source}: every ``custom:`` entry of",
        "``npu_native_functions_by_codegen.yaml``, overloads included, with its schema verbatim.",
        f"{len(names)} overloads of {len(bases)} names, "
        f"{sum(b.startswith('npu_') for b in bases)} of them ``npu_*``.",
        f"ATB: {len(atb[0])} overloads of {len({s[:s.index('(')].split('.', 1)[0] for s in atb[0]})} names, "
        f"from {atb_source}.",
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
            "",
            "# torch_npu's ATB ops (``torch.ops.atb``): every overload's schema, by name.",
            "ATB_SCHEMAS = ("]
    out += [f"    {s!r}," for s in atb[0]]
    out += [")", "",
            "# ATB names torch_npu exports as ``torch_npu.<name>`` (``_atb_ops.API_LIST``).",
            "ATB_TOP_LEVEL = " + pprint.pformat(tuple(atb[1]), width=116, compact=True).replace("\n", "\n    "),
            "",
            "# ATB names torch_npu exports as ``torch_npu.atb.<name>`` (``_atb_ops.ATB_API_LIST``).",
            "ATB_MODULE = " + pprint.pformat(tuple(atb[2]), width=116, compact=True).replace("\n", "\n    "),
            ""]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("yaml", help="torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml of the wheel")
    parser.add_argument("--atb-lib", help="torch_npu/lib/libop_plugin_atb.so (default: next to the yaml's torch_npu)")
    parser.add_argument("--atb-api", help="torch_npu/op_plugin/atb/_atb_ops.py (default: next to the yaml's torch_npu)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", action="store_true", help="fail if the committed module differs")
    args = parser.parse_args(argv)
    rows = read_table(args.yaml)
    package = pathlib.Path(args.yaml).resolve().parents[2]        # torch_npu/csrc/aten/<yaml>
    atb = read_atb(args.atb_lib or str(package / "lib/libop_plugin_atb.so"),
                   args.atb_api or str(package / "op_plugin/atb/_atb_ops.py"))
    text = render(rows, "torch_npu 2.14.0 (torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml)", atb,
                  "torch_npu/lib/libop_plugin_atb.so and torch_npu/op_plugin/atb/_atb_ops.py")
    out = pathlib.Path(args.out)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from the yaml'}")
        return 0 if same else 1
    out.write_text(text)
    names = [s[:s.index("(")] for s, _, _ in rows]
    bases = {n.split(".", 1)[0] for n in names}
    print(f"wrote {out}: {len(names)} overloads, {len(bases)} names, "
          f"{sum(b.startswith('npu_') for b in bases)} npu_* names; {len(atb[0])} ATB overloads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
