"""All op specs of the emulator, gathered from the family modules of this package.

A family module is any module here whose name does not start with ``_`` and that defines
``SPECS`` (a list of :class:`~.spec.OpSpec`); adding a family is adding its file.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Dict, List, Optional

from .spec import OpSpec

_NOT_FAMILIES = {"spec", "registry", "library", "aten"}
_specs: Optional[List[OpSpec]] = None
_by_name: Optional[Dict[str, OpSpec]] = None


def family_modules() -> list:
    """The family modules, in name order (imported on first use)."""
    names = sorted(m.name for m in pkgutil.iter_modules([os.path.dirname(__file__)])
                   if not m.name.startswith("_") and m.name not in _NOT_FAMILIES)
    modules = [importlib.import_module(f"{__package__}.{name}") for name in names]
    return [m for m in modules if hasattr(m, "SPECS")]


def specs() -> List[OpSpec]:
    """Every op with a family spec (CPU math, profile, ...), one entry per overload."""
    global _specs
    if _specs is None:
        found: List[OpSpec] = []
        seen: Dict[str, str] = {}
        for module in family_modules():
            for spec in module.SPECS:
                if spec.name in seen:
                    raise RuntimeError(f"op {spec.name} has a spec in both {seen[spec.name]} and {module.__name__}")
                seen[spec.name] = module.__name__
                found.append(spec)
        _specs = found
    return _specs


def by_name() -> Dict[str, OpSpec]:
    """``{"op" or "op.overload": OpSpec}`` of :func:`specs`."""
    global _by_name
    if _by_name is None:
        _by_name = {spec.name: spec for spec in specs()}
    return _by_name
