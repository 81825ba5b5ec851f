"""The trace as the device sees it: per-stream task queues, their ordering edges, the
core pools of each device, the blocks each op occupies, and which tasks may overlap.

Why: the core-limit and the deadlock analyses ask the same questions of a trace ("how
many cores does this op hold on which pool?", "can these two ops be in flight at once?")
and the deadlock simulation must execute exactly the ordering this module derives, so
both read one model.  Plain data, no torch.

Record conventions read here (the runtime emits them)
-----------------------------------------------------
* ``DeviceCores(seq, device, cube, vector)``: once per device,
  before its first task; the physical AI Core (cube) and Vector Core counts.  A device
  without one gets ``DEFAULT_POOL`` (24 cube / 48 vector, the 910B/A3 figures the docs use).
* ``GroupCreated(seq, group, devices)``: optional; the devices taking part
  in collective group ``group``.  Without it, a group's members are the devices that
  issued any collective of it.
* ``Kernel.cores`` says what the op asks for, ``Kernel.cube_limit``/``vector_limit`` the
  user limit in force on its stream when issued (0 = none), ``Kernel.collective`` its
  ``(group, seq)`` for collectives, matched across devices.

Ordering model (what "happens before" means here)
-------------------------------------------------
* A stream runs its tasks (``Kernel``, ``EventRecord``, ``EventWait``) one after another.
* ``EventWait`` waits for the latest ``EventRecord`` of its event issued before it; with
  none it is a no-op and is dropped.
* ``HostSync`` blocks the host thread that issued it; its effect is scoped to the synced
  device (``run_ranks`` drives each device from its own thread): the next task issued on
  each stream of that device waits for the synced work.
* A collective completes only when every member has arrived, so whatever follows a member
  on its stream happens after every member (and everything before them).

The memory analyses use ``happens_before``'s vector clocks instead; its docstring says why two
models exist and where they differ (host syncs per device here, collectives joined here).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Optional, Union

from ..trace import DeviceCores, EventRecord, EventWait, GroupCreated, HostSync, Kernel, Trace
from . import describe

CUBE, VECTOR = 0, 1
TYPES = (CUBE, VECTOR)              # the two core pools of a device
TYPE_NAMES = ("cube", "vector")
DEFAULT_POOL = (24, 48)


@dataclass(frozen=True, slots=True)
class Task:
    """One stream task; ``need`` is the blocks it occupies per pool, (cube, vector)."""

    tid: int                      # dense, in host issue order
    lane: int                     # dense stream index
    pos: int                      # position in its stream
    rec: Union[Kernel, EventRecord, EventWait]
    deps: tuple = ()              # tids that must complete first (event record, host-synced work)
    need: tuple = (0, 0)
    resident: bool = False        # holds its cores until all its blocks are resident

    @property
    def kernel(self) -> Optional[Kernel]:
        return self.rec if isinstance(self.rec, Kernel) else None

    @property
    def collective(self) -> Optional[tuple]:
        return getattr(self.rec, "collective", None)


def blocks(kernel: Kernel, pool: tuple) -> tuple:
    """Cores the op occupies per pool: its demand, cut by a limit that takes effect, and by
    the pool (more blocks than cores run in waves; a resident op can take all at most)."""
    c = kernel.cores
    out = []
    for demand, limit, size in ((c.cube, kernel.cube_limit, pool[CUBE]),
                                (c.vector, kernel.vector_limit, pool[VECTOR])):
        if c.limit_applies and limit > 0:
            demand = min(demand, limit)
        out.append(max(0, min(demand, size)))
    return tuple(out)


stream_name = describe.stream     # one naming of streams for every report


@dataclass
class TaskGraph:
    """Tasks by stream ("lane": a dense stream index), devices, pools and collectives of a
    trace, with happens-before between tasks (vector clocks, computed on first use)."""

    trace: Trace
    tasks: list = field(default_factory=list)          # tid -> Task
    lanes: list = field(default_factory=list)          # lane -> [tid in stream order], device by device
    sids: list = field(default_factory=list)           # lane -> sid
    lane_device: list = field(default_factory=list)    # lane -> device
    pools: dict = field(default_factory=dict)          # device -> (cube, vector)
    collectives: dict = field(default_factory=dict)    # (group, seq) -> [tid]
    members: dict = field(default_factory=dict)        # group -> frozenset(devices)
    _clocks: Optional[list] = None
    _columns: dict = field(default_factory=dict)
    _device_lanes: Optional[dict] = None

    # ------------------------------------------------------------------ naming
    def device(self, task: Task) -> int:
        return self.lane_device[task.lane]

    def pool(self, task: Task) -> tuple:
        return self.pools[self.device(task)]

    def stream_label(self, lane: int) -> str:
        return stream_name(self.trace, self.sids[lane])

    def describe(self, task: Task) -> str:
        """``nonzero on npu:0/stream-3 (test_x.py:14)``."""
        name = task.rec.op if task.kernel else type(task.rec).__name__
        return f"{name} on {self.stream_label(task.lane)} ({task.rec.site})"

    @property
    def device_lanes(self) -> dict:
        """device -> its lanes."""
        if self._device_lanes is None:
            self._device_lanes = defaultdict(list)
            for lane, device in enumerate(self.lane_device):
                self._device_lanes[device].append(lane)
        return self._device_lanes

    # ------------------------------------------------------------- concurrency
    def preds(self, tid: int) -> list:
        """Direct happens-before predecessors: stream predecessor, deps, collective peers."""
        t = self.tasks[tid]
        out = list(t.deps)
        if t.pos:
            prev = self.tasks[self.lanes[t.lane][t.pos - 1]]
            out.append(prev.tid)
            if prev.collective is not None:
                out.extend(self.collectives[prev.collective])
        return out

    @property
    def clocks(self) -> list:
        """``clocks[tid][lane]``: the last position on ``lane`` that happens before (or is)
        ``tid``; -1 for none.  Computed once, to a fixed point (collective edges can point
        backwards in issue order, and mismatched collective orders make cycles)."""
        if self._clocks is None:
            self._clocks = self._compute_clocks()
        return self._clocks

    def _compute_clocks(self) -> list:
        n, width = len(self.tasks), len(self.lanes)
        preds = [self.preds(tid) for tid in range(n)]
        order, acyclic = _topological(preds)
        clocks: list = [[-1] * width for _ in range(n)]
        for t in self.tasks:
            clocks[t.tid][t.lane] = t.pos
        changed = True
        while changed:  # one pass in topological order, more only around cycles
            changed = False
            for tid in order:
                clock = clocks[tid]
                for p in preds[tid]:
                    merged = [a if a >= b else b for a, b in zip(clock, clocks[p])]
                    if merged != clock:
                        clock, changed = merged, True
                clocks[tid] = clock
            changed = changed and not acyclic
        return clocks

    def ordered(self, a: int, b: int) -> bool:
        """Task ``a`` completes before task ``b`` starts, in every schedule."""
        ta = self.tasks[a]
        return a != b and self.clocks[b][ta.lane] >= ta.pos

    def concurrent(self, a: int, b: int) -> bool:
        return a != b and not self.ordered(a, b) and not self.ordered(b, a)

    def window(self, tid: int, lane: int) -> tuple:
        """Positions ``[lo, hi)`` of ``lane`` whose tasks may overlap task ``tid`` (an
        interval: everything before ``lo`` happens before it, everything from ``hi`` after)."""
        t = self.tasks[tid]
        if lane == t.lane:
            return (t.pos, t.pos)
        lo = self.clocks[tid][lane] + 1
        key = (lane, t.lane)
        column = self._columns.get(key)
        if column is None:  # what each task of ``lane`` has seen of ``t.lane``; only grows
            column = self._columns[key] = [self.clocks[u][t.lane] for u in self.lanes[lane]]
        return (lo, max(lo, bisect_left(column, t.pos)))

    def overlapping(self, task: Task):
        """``(lane, lo, hi)`` for each other stream of ``task``'s device: the positions that
        may be in flight while ``task`` is."""
        for lane in self.device_lanes[self.device(task)]:
            if lane != task.lane:
                yield (lane, *self.window(task.tid, lane))


def _topological(preds: list) -> tuple:
    """Kahn's order of the predecessor graph, and whether it is acyclic; tasks on or after
    cycles follow in issue order."""
    n = len(preds)
    succs: list = [[] for _ in range(n)]
    missing = [0] * n
    for tid, ps in enumerate(preds):
        for p in ps:
            succs[p].append(tid)
            missing[tid] += 1
    ready = [tid for tid in range(n) if not missing[tid]]
    order = []
    while ready:
        tid = ready.pop()
        order.append(tid)
        for s in succs[tid]:
            missing[s] -= 1
            if not missing[s]:
                ready.append(s)
    seen = set(order)
    return order + [tid for tid in range(n) if tid not in seen], len(order) == n


def of(trace: Trace, cache: Optional[dict] = None) -> TaskGraph:
    """The task graph of ``trace``, built once per ``analysis.analyze`` call (``cache``)."""
    if cache is None:
        return build(trace)
    if "taskgraph" not in cache:
        cache["taskgraph"] = build(trace)
    return cache["taskgraph"]


def build(trace: Trace) -> TaskGraph:
    """Derive the task graph of ``trace`` (one pass over its records)."""
    g = TaskGraph(trace)
    declared: dict = {}
    lane_of: dict = {}
    last_record: dict = {}                 # event -> tid of its latest record
    barriers: dict = defaultdict(list)     # device -> [targets of each host sync]
    applied: dict = defaultdict(int)       # lane -> barriers of its device already applied

    def lane(sid: int) -> int:
        if sid not in lane_of:
            info = trace.streams.get(sid)
            lane_of[sid] = len(g.lanes)
            g.lanes.append([])
            g.sids.append(sid)
            g.lane_device.append(info.device if info is not None else 0)
        return lane_of[sid]

    def add(rec, deps: tuple) -> Task:
        ln = lane(rec.stream)
        dev = g.lane_device[ln]
        pending = barriers[dev][applied[ln]:]
        applied[ln] = len(barriers[dev])
        deps = tuple(dict.fromkeys(deps + tuple(t for targets in pending for t in targets)))
        need, resident = (0, 0), False
        if isinstance(rec, Kernel):
            need = blocks(rec, g.pools.setdefault(dev, DEFAULT_POOL))
            resident = rec.cores.all_resident and need != (0, 0)
        task = Task(len(g.tasks), ln, len(g.lanes[ln]), rec, deps, need, resident)
        g.tasks.append(task)
        g.lanes[ln].append(task.tid)
        if task.collective is not None:
            g.collectives.setdefault(task.collective, []).append(task.tid)
        return task

    def synced(rec: HostSync) -> tuple:
        """(device, tids the host waits for)."""
        if rec.what == "event":
            tid = last_record.get(rec.event)
            return (None, ()) if tid is None else (g.lane_device[g.tasks[tid].lane], (tid,))
        if rec.what in ("stream", "read") and rec.stream is not None:
            ln = lane_of.get(rec.stream)
            return (None, ()) if ln is None else (g.lane_device[ln], (g.lanes[ln][-1],))
        return rec.device, tuple(lanes[-1] for ln, lanes in enumerate(g.lanes)
                                 if lanes and g.lane_device[ln] == rec.device)

    for rec in trace.records:  # pools first: a kernel's blocks depend on them
        if isinstance(rec, DeviceCores):
            g.pools[rec.device] = (rec.cube, rec.vector)
    for rec in trace.records:
        if isinstance(rec, GroupCreated):
            declared[rec.group] = frozenset(rec.devices)
        elif isinstance(rec, Kernel):
            add(rec, ())
        elif isinstance(rec, EventRecord):
            last_record[rec.event] = add(rec, ()).tid
        elif isinstance(rec, EventWait):
            if rec.event in last_record:
                add(rec, (last_record[rec.event],))
        elif isinstance(rec, HostSync):
            device, targets = synced(rec)
            if targets:
                barriers[device].append(targets)
    for dev in g.lane_device:
        g.pools.setdefault(dev, DEFAULT_POOL)
    seen: dict = defaultdict(set)
    for (group, _), tids in g.collectives.items():
        seen[group].update(g.lane_device[g.tasks[t].lane] for t in tids)
    g.members = {group: declared.get(group, frozenset(devs)) for group, devs in seen.items()}
    _lanes_by_device(g)
    return g


def _lanes_by_device(g: TaskGraph) -> None:
    """Renumber the lanes device by device, in first-use order within a device.

    Why: ``run_ranks`` drives each device from its own thread, so the issue order across
    devices changes from run to run; lanes numbered by first use would make every analysis
    that walks lanes (the deadlock search and its report, the core checks) differ per run.
    One device's order is its thread's own, hence stable."""
    order = sorted(range(len(g.lanes)), key=g.lane_device.__getitem__)
    if order == list(range(len(g.lanes))):
        return
    new = {old: i for i, old in enumerate(order)}
    g.lanes = [g.lanes[old] for old in order]
    g.sids = [g.sids[old] for old in order]
    g.lane_device = [g.lane_device[old] for old in order]
    g.tasks = [replace(t, lane=new[t.lane]) for t in g.tasks]


class RangeMax:
    """Maximum of ``values[lo:hi]`` in O(1) after O(n log n) set-up (a sparse table)."""

    def __init__(self, values) -> None:
        self.table = [list(values)]
        step = 1
        while 2 * step <= len(self.table[0]):
            prev = self.table[-1]
            self.table.append([max(prev[i], prev[i + step]) for i in range(len(prev) - step)])
            step *= 2

    def __call__(self, lo: int, hi: int) -> int:
        if hi <= lo:
            return 0
        k = (hi - lo).bit_length() - 1
        row = self.table[k]
        return max(row[lo], row[hi - (1 << k)])
