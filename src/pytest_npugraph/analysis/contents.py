"""What a trace contains that the costly analyses need before they can report anything.

Why: most tests run on one stream with no collectives and no core limits.  On such a trace the
cross-stream analyses build their models (happens-before clocks, the race engine's shadow memory,
the task graph, the deadlock search) and provably find nothing, and that was most of the plugin's
per-test cost.  One pass over the records (``of``, memoized per ``analyze`` call like the clocks)
tells each of them whether it can report at all; each precondition below is a proof that the
analysis's own rules cannot fire, not a heuristic, and tests/analysis/test_contents.py checks
every one against the full analyses on random programs (``FAST = False`` turns them off).

Preconditions (each analysis returns no hazard when its precondition says so):

* ``races.conflicts`` (``race``, ``missing-record-stream`` and ``reinplace-conflict`` conflicts):
  fewer than two streams issue a ``Kernel``.  A conflict pairs accesses of two different streams
  (``against`` skips the accessing stream's own history), and only kernels access memory.  Host
  races (``HostAccess``) are a separate analysis and always run.
* ``record_stream``'s rule: fewer than two streams issue a ``Kernel``.  A finding needs a use on a
  stream B other than the block's allocation stream A and then a kernel on A: two kernel streams.
* ``cores``: no ``StreamLimit``/``DeviceLimit`` record, no kernel issued under a limit
  (``cube_limit``/``vector_limit`` 0), and either no resident kernel (``all_resident``) or at most
  one task stream per device.  Range checks read only those limits; ``limit-ineffective`` needs a
  limit in force; an oversubscribed set counts only resident ops and ops under a limit, and needs
  two streams of one device.
* ``deadlock``: no collective kernel (``Kernel.collective``) and either no resident kernel or at
  most one task stream per device.  Without collectives every prerequisite of a task was issued
  before it (event records, host-synced work), and the head with the smallest task id can always
  step: its prerequisites are done, and it finds its cores free (ops that are not resident hold
  none while waiting; a resident op alone on its device takes what it needs, which fits the pool).
  So no reachable state is stuck, and no mismatched collective exists.  A collective is enough to
  run the search: one issued twice on one stream for one ``(group, seq)`` (a send to self), or in
  a group whose other devices never issue it, deadlocks on a single stream.
* ``overwrite`` (``output-overwrite``): no kernel of a graph (``Kernel.graph``).  A stale output is
  one a replayed kernel wrote over, and a pool block is clobbered only by a replayed kernel's write.
* ``super_kernel``: no ``SuperKernelBegin``/``SuperKernelEnd`` record and no kernel whose profile
  starts the next early (``OpCores.early_start``): every rule needs a scope record or such a kernel.
* ``reinplace`` (``reinplace-conflict``): no ``Reinplace`` record.  A veto is one; a conflict is a
  race on a write that an applied ``Reinplace`` marker made in place (``races.reinplace_of``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..trace import (DeviceLimit, EventRecord, EventWait, Kernel, Reinplace, StreamLimit, SuperKernelBegin,
                     SuperKernelEnd)
from .happens_before import memo

FAST = True     # False: every analysis runs in full (the differential tests compare the two)


@dataclass(frozen=True)
class Contents:
    kernel_streams: int        # streams that issue at least one Kernel
    lanes_per_device: int      # the most task streams (Kernel, EventRecord, EventWait) of one device
    collectives: bool          # a Kernel with ``collective`` set
    resident: bool             # a Kernel whose profile is ``all_resident``
    limits: bool               # a StreamLimit/DeviceLimit record, or a Kernel issued under a limit
    graph_kernels: bool        # a Kernel of a captured graph (``Kernel.graph``: capture or replay)
    super_kernels: bool        # a SuperKernelBegin/End record, or a Kernel whose profile has ``early_start``
    reinplace: bool            # a Reinplace record

    @property
    def no_conflicts(self) -> bool:
        """``races.conflicts`` and ``record_stream``'s rule find nothing."""
        return FAST and self.kernel_streams < 2

    @property
    def no_core_hazards(self) -> bool:
        """``cores.find`` finds nothing."""
        return FAST and not self.limits and (not self.resident or self.lanes_per_device < 2)

    @property
    def no_deadlock(self) -> bool:
        """``deadlock.find`` finds nothing."""
        return FAST and not self.collectives and (not self.resident or self.lanes_per_device < 2)

    @property
    def no_overwrite(self) -> bool:
        """``overwrite.find`` finds nothing."""
        return FAST and not self.graph_kernels

    @property
    def no_super_kernel(self) -> bool:
        """``super_kernel.find`` finds nothing."""
        return FAST and not self.super_kernels

    @property
    def no_reinplace(self) -> bool:
        """``reinplace.find`` finds nothing."""
        return FAST and not self.reinplace


def compute(trace) -> Contents:
    records = trace.records
    types = set(map(type, records))
    kernel_streams: set = set()
    collectives = resident = limits = graph_kernels = early_start = False
    for rec in records:
        if type(rec) is Kernel:
            kernel_streams.add(rec.stream)
            cores = rec.cores
            if rec.collective is not None:
                collectives = True
            if cores.all_resident:
                resident = True
            if cores.early_start:
                early_start = True
            if rec.cube_limit or rec.vector_limit:
                limits = True
            if rec.graph is not None:
                graph_kernels = True
    task_streams = set(kernel_streams)
    if EventRecord in types or EventWait in types:
        task_streams.update(rec.stream for rec in records if type(rec) is EventRecord or type(rec) is EventWait)
    limits = limits or StreamLimit in types or DeviceLimit in types
    super_kernels = early_start or SuperKernelBegin in types or SuperKernelEnd in types
    per_device: dict = {}
    for sid in task_streams:       # the device taskgraph puts a stream's lane on
        info = trace.streams.get(sid)
        device = info.device if info is not None else 0
        per_device[device] = per_device.get(device, 0) + 1
    return Contents(len(kernel_streams), max(per_device.values(), default=0), collectives, resident, limits,
                    graph_kernels, super_kernels, Reinplace in types)


def of(trace, cache: dict | None = None) -> Contents:
    """The ``Contents`` of ``trace``, once per ``analyze`` call (``cache``)."""
    return memo(cache, "contents", trace, compute)
