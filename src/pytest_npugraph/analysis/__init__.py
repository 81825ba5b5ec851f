"""Hazard analyses over a recorded ``Trace`` (pure Python, no torch).

``analyze(trace)`` runs every analysis in ``REGISTRY``.  An entry is ``(kinds, function)``:
``kinds`` are the hazard kinds it can report (``None``: any; used to skip analyses when
``analyze`` is asked for other kinds) and ``function``
is called as ``function(trace, cache)``, where ``cache`` is a dict shared by the analyses
of one ``analyze`` call, so the happens-before clocks (``happens_before.of(trace, cache)``)
and the race engine's conflicts are computed once.  To add an analysis, append one line.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect

from ..hazard import KINDS
from . import events, races, record_stream


def _optional(name: str):
    """Run ``analysis.<name>.find(trace[, cache=...])`` if that module exists (imported lazily)."""
    module_name = f"{__name__}.{name}"

    def run(trace, cache):
        if importlib.util.find_spec(module_name) is None:
            return []
        find = importlib.import_module(module_name).find
        takes_cache = "cache" in inspect.signature(find).parameters
        return find(trace, cache=cache) if takes_cache else find(trace)

    run.__name__ = f"{name}.find"
    return run


REGISTRY: list = [
    (("race",), races.find),
    (("missing-record-stream",), record_stream.find),
    (("event-misuse",), events.find),
    (("core-limit", "limit-ineffective"), _optional("cores")),
    (("deadlock",), _optional("deadlock")),
    (("output-overwrite",), _optional("overwrite")),
    (("super-kernel",), _optional("super_kernel")),
    (("reinplace-conflict",), _optional("reinplace")),
]


def analyze(trace, kinds=None) -> list:
    """Every hazard in ``trace`` (only those of ``kinds``, an iterable of kind strings, if given)."""
    wanted = None if kinds is None else set(kinds)
    if wanted is not None and not wanted <= set(KINDS):
        unknown = ", ".join(sorted(wanted - set(KINDS)))
        raise ValueError(f"unknown hazard kind(s) {unknown}; expected some of {', '.join(KINDS)}")
    cache: dict = {}
    found = []
    for entry_kinds, function in REGISTRY:
        if wanted is not None and entry_kinds is not None and wanted.isdisjoint(entry_kinds):
            continue
        found.extend(h for h in function(trace, cache) if wanted is None or h.kind in wanted)
    return found
