"""Catching a conftest.py that puts a mock over the emulated ``torch_npu`` / ``torch.npu``.

Suites written for CPU runners stub the NPU packages in conftest.py (``sys.modules["torch_npu"] =
MagicMock()``, ``torch.npu = MagicMock()``).  Under the emulation that leaves a half-mocked state:
some names are the emulated package's, some the mock's, user code gets one or the other depending on
when it imported them, and tests fail far from the cause ("No module named 'torch.npu'") or pass on
mocks.  So after each conftest.py is imported the plugin checks that the emulated modules are still
the ones in place, and if not stops the run once, with an error that names the conftest's lines that
did it and the fix.  An error rather than a warning: the run that would follow tests neither the
emulation nor the mocks, and nothing in it can be trusted.  (A *test* that re-stubs is different:
it is undone after the test with a warning, see ``activation.restore``; a *test module* that stubs
when imported is undone once it is imported, with a warning, see ``undo``.)

Imports neither torch nor pytest.
"""
from __future__ import annotations

import os
import re
import sys

from . import activation

# lines that install a stub: sys.modules["torch_npu..."] = / setitem / setdefault / patch.dict, torch.npu =
_PATTERNS = (
    re.compile(r"""sys\.modules\s*\[\s*['"](torch_npu|torchair)(\.[\w.]+)?['"]\s*\]\s*="""),
    re.compile(r"""sys\.modules\s*\.\s*(setdefault|update|__setitem__)\s*\(.*['"](torch_npu|torchair)\b"""),
    re.compile(r"""setitem\s*\(\s*sys\.modules\s*,\s*['"](torch_npu|torchair)\b"""),
    re.compile(r"""patch\.dict\s*\(\s*['"]?sys\.modules['"]?.*['"](torch_npu|torchair)\b"""),
    re.compile(r"""\btorch\s*\.\s*npu\s*=(?!=)"""),
    re.compile(r"""setattr\s*\(\s*torch\s*,\s*['"]npu['"]"""),
)


def swapped() -> list:
    """What is no longer the emulated package: module names, and ``torch.npu``."""
    if activation.SHIMS not in sys.path:
        return []
    names = sorted(name for name, module in list(sys.modules.items())
                   if isinstance(name, str) and name.split(".")[0] in activation.PACKAGES
                   and module is not None and not activation._is_emulated(module))
    torch = sys.modules.get("torch")
    if torch is not None and "npu" in getattr(torch, "__dict__", {}):
        npu = torch.__dict__["npu"]
        emulated = sys.modules.get("torch_npu.npu")
        if (emulated is not None and npu is not emulated) or (emulated is None and not activation._is_emulated(npu)):
            names.append("torch.npu")
    return names


def stub_lines(path: str) -> list:
    """``(line number, text)`` of the lines of ``path`` that look like they install a stub."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [(i, line.strip()) for i, line in enumerate(lines, 1) if any(p.search(line) for p in _PATTERNS)]


def message(conftest: str, names: list, rootdir: str = None) -> str:
    where = os.path.relpath(conftest, rootdir) if rootdir else conftest
    lines = stub_lines(conftest)
    shown = "\n".join(f"  {where}:{n}: {text}" for n, text in lines) or f"  (no assignment found in {where}: a " \
        f"module it imports may install the stub)"
    return (f"npugraph: {where} replaced the emulated {', '.join(names)} with a stub while NPU emulation is on:\n"
            f"{shown}\n"
            "A stub on top of the emulation leaves torch_npu half-mocked (code that imported it earlier keeps the "
            "emulated package, later imports get the stub), so no result of this run could be trusted.\n"
            "Fix: delete these lines (the emulated torch_npu computes real values and the stubs are not needed), or "
            "install them only when there is no NPU: the emulation puts `npu-smi` on PATH, so a conftest that "
            "probes `npu-smi info` (as vLLM-Ascend's does) keeps its stubs for plain CPU runs only. To run the suite "
            "on its stubs instead, pass --npu-emulate=off. See docs/migrating-from-magicmock.md.")


def undo(state: dict) -> list:
    """Put the emulated modules and ``torch.npu`` back after a test module's import (``state`` is
    ``activation.snapshot()`` from before it); returns what had been replaced.  Also when the module
    imported the emulated torch_npu itself (``state`` empty) and then stubbed over it."""
    changed = activation.restore(state)      # torch.npu too, if the emulated one was there before
    torch, emulated = sys.modules.get("torch"), sys.modules.get("torch_npu.npu")
    if "torch.npu" in swapped() and torch is not None and emulated is not None and activation._is_emulated(emulated):
        torch.npu = emulated
        changed.append("torch.npu")
    return changed


def module_message(path: str, names: list, rootdir: str = None) -> str:
    where = os.path.relpath(path, rootdir) if rootdir else path
    lines = "; ".join(f"line {n}: {text}" for n, text in stub_lines(path)) or "a module it imports did it"
    return (f"npugraph: {where} replaced the emulated {', '.join(names)} with a stub when imported ({lines}); "
            f"restored the emulated versions, so its tests and later ones run on the emulation (which computes "
            f"real values: the stub is not needed; guard it with an `npu-smi info` probe or pass --npu-emulate=off "
            f"to run on stubs)")
