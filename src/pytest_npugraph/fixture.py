"""The ``npugraph`` fixture object (docs/reference.md, "The npugraph fixture"): the test's emulated
runtime and checker."""
from __future__ import annotations

import contextlib
import re

import pytest

from ._context import CONTEXT
from .hazard import KINDS
from .outcome import format_report, hazards_of


class NpuGraph:
    def __init__(self, item, outcome):
        import torch_npu  # noqa: F401  (installs the npu device in torch)

        from .runtime.runtime import current

        self._item = item
        self._outcome = outcome
        self._hazards = hazards_of(item)
        self.runtime = current()

    # --------------------------------------------------------------- the machine
    @property
    def chip(self) -> str:
        return CONTEXT.config.chip.name

    @property
    def cube_cores(self) -> int:
        return CONTEXT.config.chip.cube_cores

    @property
    def vector_cores(self) -> int:
        return CONTEXT.config.chip.vector_cores

    @property
    def device_count(self) -> int:
        return CONTEXT.config.device_count

    @property
    def trace(self):
        """The recorded trace (plain data: see ``pytest_npugraph.trace``), with the traces of the processes
        the test started so far (inherit.py)."""
        from .inherit import absorb

        absorb()
        return self.runtime.trace

    @property
    def graphs(self) -> list:
        return self.runtime.graphs

    def run_ranks(self, fn, *args, processes: bool = False) -> list:
        """Run ``fn(rank, *args)`` once per emulated device, each in its own thread with its own
        current device (rank r drives ``npu:r``) and ``torch.distributed`` environment (backend
        ``"hccl"``); returns the results in rank order.  A rank's exception is re-raised (with a
        note naming the rank); collectives that can never complete raise ``CollectiveError``.
        ``processes=True``: each rank is a process of its own, as ``torch.multiprocessing.spawn``
        starts them (``fn`` and ``args`` must pickle); their traces join the test's."""
        __tracebackhide__ = True
        if not callable(fn):
            raise TypeError(f"npugraph.run_ranks: fn must be a callable taking the rank, got {type(fn).__name__}")
        if processes:
            from .runtime.collectives import launch

            return launch.run(fn, args, self.device_count)
        from torch_npu.distributed import _ranks

        from .runtime import collectives

        return collectives.run_ranks(self.runtime, fn, args, context=_ranks.CONTEXT)

    # ------------------------------------------------------------------ hazards
    @property
    def hazards(self) -> list:
        """The hazards found so far in this test (not those absorbed by ``expect``)."""
        return self._hazards.open()

    @contextlib.contextmanager
    def expect(self, kind: str, match: str = None):
        """Fail unless the block produces a hazard of ``kind`` (message matching ``match``); absorb it."""
        __tracebackhide__ = True
        if kind not in KINDS:
            raise ValueError(f"npugraph.expect: unknown hazard kind {kind!r}; kinds: {', '.join(KINDS)}")
        from .runtime.executor import DeviceHang

        before = {h.key for h in self._hazards.analyze()}      # (with the children's traces so far)
        start = len(self.runtime.trace)
        hang = None
        try:
            yield
        except DeviceHang as exc:   # the device hung: the deadlock (or event-misuse) hazard says where and why
            if kind not in ("deadlock", "event-misuse"):
                raise
            hang = exc
        from .inherit import absorb

        absorb()
        end = len(self.runtime.trace)
        found = [h for h in self._hazards.analyze()
                 if h.kind == kind and h.key not in self._hazards.absorbed
                 and (h.key not in before or any(start <= s < end for s in h.seqs))
                 and (match is None or re.search(match, h.message))]
        if not found:
            others = [h for h in self._hazards.open() if h.key not in before]
            detail = ("\nother hazards in the block:\n" + format_report(others)) if others else ""
            if hang is not None:
                detail += f"\nthe block raised DeviceHang: {hang}"
            pytest.fail(f"npugraph.expect({kind!r}" + (f", match={match!r}" if match else "") +
                        f"): the block produced no such hazard{detail}", pytrace=False)
        self._hazards.absorbed.update(h.key for h in found)

    def timeline(self, path) -> None:
        """Write this test's emulated schedule as Chrome-trace JSON (Perfetto, chrome://tracing)."""
        from .report import timeline

        found = self._hazards.analyze()
        status = {h.key: self._outcome.status_of(h, self._hazards, CONTEXT.config.allow) for h in found}
        timeline.write(path, self.runtime.trace, found, status)

    def assert_clean(self, *kinds: str) -> None:
        """Raise AssertionError if a hazard found so far would fail the test (error severity, not
        allowed by ``npu_allow``, not absorbed by ``expect``), describing every hazard found, warnings
        included.  With ``kinds`` named, any hazard of those kinds fails it, warnings included."""
        __tracebackhide__ = True      # the failure is the user's line calling assert_clean, not this code
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"npugraph.assert_clean: unknown hazard kind {kind!r}; kinds: {', '.join(KINDS)}")
        found = self.hazards
        if self._hazards.error is not None:        # never call a trace clean that an analysis failed on
            raise self._hazards.error
        if kinds:
            failing = [h for h in found if h.kind in kinds]
        else:
            allow = CONTEXT.config.allow
            failing = [h for h in found if h.severity != "warning" and h.kind not in allow]
        if failing:
            raise AssertionError(format_report(found if not kinds else failing))
