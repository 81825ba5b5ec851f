"""Putting the emulated ``torch_npu``/``torchair`` in front of the import system, and keeping
them there: tests that replace them (``sys.modules["torch_npu"] = MagicMock()``) are undone."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

SHIMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims")
PACKAGES = ("torch_npu", "torchair", "npugraph_ex")
# CANN's pyACL: emulated too, but a suite's stub of it is its own business (it is not pip-installable,
# so CPU suites stub it): not guarded like PACKAGES, only removed with them on deactivation
OTHER_SHIMS = ("acl",)


def real_torch_npu_installed() -> bool:
    """Whether a real torch_npu is importable (checked without importing it, or torch)."""
    if SHIMS in sys.path:
        return False
    return importlib.util.find_spec("torch_npu") is not None


def activate() -> None:
    if SHIMS not in sys.path:
        sys.path.insert(0, SHIMS)
        importlib.invalidate_caches()
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES and not _is_emulated(sys.modules[name]):
            del sys.modules[name]   # a real one imported before the plugin ran


def deactivate() -> None:
    if SHIMS in sys.path:
        sys.path.remove(SHIMS)
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES + OTHER_SHIMS and _is_emulated(sys.modules[name]):
            del sys.modules[name]


def _is_emulated(module) -> bool:
    path = getattr(module, "__file__", None) or ""
    return path.startswith(SHIMS)


class _PackageModules:
    """The names in ``sys.modules`` that belong to the emulated packages, looked up again only when
    ``sys.modules`` changed size or its newest entry: a suite imports thousands of modules, and
    scanning them all before and after every test cost 1-3 ms a test (more with vLLM imported).
    Any import or removal changes one of the two (an insertion becomes the newest entry); replacing
    an entry in place changes neither, and ``restore`` checks those entries by identity."""

    def __init__(self):
        self.marker = None
        self.ours: list = []

    def names(self) -> list:
        modules = sys.modules
        marker = (len(modules), next(reversed(modules), None))
        if marker != self.marker:
            self.ours = [n for n in list(modules) if isinstance(n, str) and n.partition(".")[0] in PACKAGES]
            self.marker = marker
        return self.ours


_MODULES = _PackageModules()


def snapshot() -> dict:
    """The emulated modules and torch attributes a test must not leave changed."""
    if "torch_npu" not in sys.modules and "torchair" not in sys.modules:
        return {}
    state = {name: sys.modules[name] for name in _MODULES.names()}
    torch = sys.modules.get("torch")
    if torch is not None and "torch_npu" in state:
        state[("torch", "npu")] = getattr(torch, "npu", None)
        state[("Tensor", "npu")] = torch.Tensor.__dict__.get("npu")
        state[("Module", "npu")] = torch.nn.Module.__dict__.get("npu")
    return state


def restore(state: dict) -> list:
    """Undo what a test changed; returns the names it had changed (for a warning)."""
    changed = []
    for name in [n for n in _MODULES.names() if n not in state]:
        if not _is_emulated(sys.modules[name]):
            changed.append(name)
            del sys.modules[name]
    for key, value in state.items():
        if isinstance(key, str):
            if sys.modules.get(key) is not value:
                changed.append(key)
                sys.modules[key] = value
            continue
        owner_name, attr = key
        torch = sys.modules["torch"]
        owner = {"torch": torch, "Tensor": torch.Tensor, "Module": torch.nn.Module}[owner_name]
        current = owner.__dict__.get(attr) if owner_name != "torch" else getattr(torch, attr, None)
        if current is not value and value is not None:
            changed.append(f"{owner_name}.{attr}")
            setattr(owner, attr, value)
    return changed
