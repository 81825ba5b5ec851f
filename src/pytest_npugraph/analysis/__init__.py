"""Hazard analyses over a recorded ``Trace`` (pure Python, no torch).

``analyze(trace)`` runs every analysis in ``REGISTRY``.  An entry is ``(kinds, function)``:
``kinds`` are the hazard kinds it can report (``None``: any; used to skip analyses when
``analyze`` is asked for other kinds) and ``function`` is called as ``function(trace, cache)``,
where ``cache`` is a dict shared by the analyses of one ``analyze`` call, so the happens-before
clocks (``happens_before.of(trace, cache)``) and the race engine's conflicts are computed once, and
so is ``contents.of(trace, cache)``, which lets an analysis that provably has nothing to report on the
trace (one stream, no limits, no collectives, no graph records...) return at once.
Every analysis is imported here by name: a renamed module fails at import, never silently
yields no hazards.  To add an analysis, import it and append one line (wrapped in
``_device_by_device`` if it reports in trace order: ``run_ranks`` tests must read the same on every run).
"""
from __future__ import annotations

import re
import traceback

from ..hazard import KINDS
from . import (cores, deadlock, describe, events, external_waits, host_races, overwrite, races, record_stream,
               reinplace, super_kernel)


def _device_by_device(find):
    """``find``'s hazards device by device (``describe.by_device``): for the analyses that report
    in trace order, where ``run_ranks`` interleaves the ranks' records differently on every run.
    The task-graph analyses (cores, deadlock) order their own reports by device and lane."""
    def run(trace, cache):
        return describe.by_device(trace, find(trace, cache))

    run.__name__, run.__qualname__ = find.__name__, f"{find.__module__}.{find.__qualname__}"   # names a failure
    return run


REGISTRY: list = [
    (("race",), _device_by_device(races.find)),
    (("race",), _device_by_device(host_races.find)),
    (("missing-record-stream",), _device_by_device(record_stream.find)),
    (("event-misuse",), _device_by_device(events.find)),
    (("event-misuse", "deadlock"), _device_by_device(external_waits.find)),
    (("core-limit", "limit-ineffective"), cores.find),
    (("deadlock",), deadlock.find),
    (("output-overwrite",), _device_by_device(overwrite.find)),
    (("super-kernel",), _device_by_device(super_kernel.find)),
    (("reinplace-conflict",), _device_by_device(reinplace.find)),
]


class AnalysisError(Exception):
    """One or more analyses raised (an emulator bug).  The others still ran: ``hazards`` holds what
    they found, so a broken analysis never hides a race; ``failures`` the (analysis, exception) pairs."""

    def __init__(self, failures, hazards):
        self.failures = failures
        self.hazards = hazards
        details = "\n".join(f"--- {name} ---\n" + "".join(traceback.format_exception(exc)).rstrip()
                             for name, exc in failures)
        super().__init__(f"npugraph: {len(failures)} analysis(es) failed on this test's trace (a pytest-npugraph "
                         f"bug; please report it): {', '.join(name for name, _ in failures)}\n{details}")


def analyze(trace, kinds=None) -> list:
    """Every hazard in ``trace`` (only those of ``kinds``, an iterable of kind strings, if given).
    Raises ``AnalysisError`` (carrying the other analyses' hazards) if an analysis raises."""
    wanted = None if kinds is None else set(kinds)
    if wanted is not None and not wanted <= set(KINDS):
        unknown = ", ".join(sorted(wanted - set(KINDS)))
        raise ValueError(f"unknown hazard kind(s) {unknown}; expected some of {', '.join(KINDS)}")
    if wanted is not None and "core-limit" in wanted:
        wanted.add("deadlock")      # a deadlock takes in the core-limit hazards that cause it (fold_causes)
    cache: dict = {}
    found, failures = [], []
    try:    # ExternalEvent waits issued before their record run after it: every analysis reads that order
        trace = external_waits.effective(trace, cache)
    except Exception as exc:  # noqa: BLE001
        failures.append(("external_waits.effective", exc))
    for entry_kinds, function in REGISTRY:
        if wanted is not None and entry_kinds is not None and wanted.isdisjoint(entry_kinds):
            continue
        try:
            found.extend(h for h in function(trace, cache) if wanted is None or h.kind in wanted)
        except Exception as exc:      # keep going: the other analyses' hazards must still be reported
            failures.append((function.__qualname__, exc))
    found = same_on_devices(fold_causes(_with_made_at(trace, found)))
    if kinds is not None:
        found = [h for h in found if h.kind in set(kinds)]
    if failures:
        raise AnalysisError(failures, found) from failures[0][1]
    return found


_DEVICE = re.compile(r"npu:\d+")
_ADDRESS = re.compile(r"0x[0-9a-f]+")
_RANK = re.compile(r"\bof rank \d+")


def _devices(h) -> list:
    return sorted({int(m[4:]) for s in h.streams for m in _DEVICE.findall(s)})


def same_on_devices(hazards: list) -> list:
    """One report per root cause: the hazards that read the same but for the device (and its rank,
    addresses) on several devices (a ``run_ranks`` body racing on every rank) are one hazard, the
    first device's, ending ``(the same on npu:1, ...)`` and listing every device's streams."""
    groups: dict = {}
    out: list = []
    for h in hazards:
        devices = _devices(h)
        if len(devices) != 1 or h.kind == "deadlock":
            out.append(h)
            continue
        text = _RANK.sub("of rank #", _ADDRESS.sub("0x#", _DEVICE.sub("npu:#", h.message)))
        key = (h.kind, h.severity, text, tuple(h.where))
        group = groups.get(key)
        if group is None or devices[0] in group[1]:
            groups[key] = (h, {devices[0]})
            out.append(h)
            continue
        first, seen = group
        seen.add(devices[0])
        first.streams = list(dict.fromkeys(first.streams + h.streams))
        first.seqs = tuple(dict.fromkeys(first.seqs + h.seqs))
    for first, seen in groups.values():
        if len(seen) > 1:
            shown = _devices(first)[0]
            first.message += "\n(the same on " + ", ".join(f"npu:{d}" for d in sorted(seen - {shown})) + ")"
    return out


def _with_made_at(trace, hazards: list) -> list:
    """Each report that names eager streams ends with the lines that made them (describe.made_at)."""
    for h in hazards:
        made = describe.made_at(trace, h)
        if made:
            h.message += f"\n({made})"
    return hazards


def fold_causes(hazards: list) -> list:
    """One report per root cause: a ``core-limit`` oversubscription (error) with at least two of its
    streams blocked in a ``deadlock`` is that deadlock's cause (ops that hold cores until all their
    blocks are in, starving each other), shown inside its report (a ``cause:`` line before its fix)
    instead of as a report of its own."""
    deadlocks = [h for h in hazards if h.kind == "deadlock"]
    if not deadlocks:
        return hazards
    folded: set = set()
    for i, h in enumerate(hazards):
        if h.kind != "core-limit" or h.severity != "error" or not h.summary:
            continue
        into = next((d for d in deadlocks if len(set(h.streams) & set(d.streams)) >= 2), None)
        if into is None:
            continue
        folded.add(i)
        head, sep, fix = into.message.partition("\n  fix: ")
        into.message = f"{head}\n  cause: {h.summary}{sep}{fix}"
        into.seqs = tuple(dict.fromkeys(into.seqs + h.seqs))
    return [h for i, h in enumerate(hazards) if i not in folded]
