"""A stretch of the trace recorded once and appended again on later runs, with fresh memory.

Why: a static graph (GE mode's, ``compiler/ge_plan.py``) issues the same device work on every run:
the same tasks on the same streams, the same event records and waits, the same allocations and
frees in the same order.  Running it op by op through the NPU tensors costs ten times its math, so
the first run is recorded (``Stretch.record``: the trace rows it appended, turned into the task
templates a graph capture keeps, ``graphs.append_tasks``) and later runs compute the math on the
CPU payloads and append the templates (``Stretch.append``).  Unlike a replay, each run gets fresh
memory: every allocation is a real ``malloc`` of the caching allocator at the point the recorded
run made it (so its addresses, reuse, statistics and ``Alloc.reuses`` are what an op-by-op run
gets), every free a real ``free``, and every task's spans are moved onto this run's blocks.  A run
whose allocator starts where a watched run's did (``alloc_schedule.py``) gets the same addresses, so
``FastRun`` applies that run's allocator work at once and builds its rows from resolved templates.

A stretch holds only what it can reproduce: tasks, allocations and frees of blocks it allocated,
event records and waits of events it was told about, stream syncs (a blocking copy of a host
constant into the graph) and SuperKernel markers.  Anything else (a host read or another host
sync, ``record_stream``, a collective, a graph call's output read, a free of a block from
elsewhere, a site taken from the stack inside a node) makes ``record`` raise ``Unplannable``.

Sites: a record made while the graph node's line was the site hint keeps it; a record made without
one carries the line that called the graph, which ``append`` takes from the current call (``CALLER``).
"""
from __future__ import annotations

import bisect
import operator
from typing import Optional

from .. import trace as T
from ..trace import ALLOC_ROW, FREE_ROW, KERNEL_ROW
from .alloc_schedule import Watch, pool_key


SCHEDULES = 4           # watched runs a stretch keeps (``Stretch.fast``)


class Unplannable(Exception):
    """The recorded stretch holds something a plan cannot reproduce (the message says what)."""


class _Caller:
    """The site placeholder: the user's line that called the graph this time."""

    def __repr__(self) -> str:
        return "CALLER"


CALLER = _Caller()

_MARKERS = (T.SuperKernelBegin, T.SuperKernelEnd)


class Stretch:
    """Task templates of one recorded run (see the module docstring).

    ``bases``: the memory spans are relative to, by index: the input blocks first (as given to
    ``record``), then fixed blocks (constants), then one per allocation of the stretch (a slot).
    ``live``: slots the stretch allocated and did not free (the blocks of its outputs)."""

    def __init__(self, tasks, n_inputs, fixed, slot_base, live, bases):
        self.tasks = tasks
        self.n_inputs = n_inputs
        self.fixed = fixed                    # the fixed Blocks, base index n_inputs + i
        self.slot_base = slot_base            # base index of the first slot
        self.live = live                      # set of slot base indices alive at the end
        self.bases = bases                    # bid -> base index, of the recorded run's blocks
        # ("a" tasks) the allocations' streams (templates), sizes and devices, in slot order
        self.allocs = [(t[1], t[3], t[4]) for t in tasks if t[0] == "a"]
        # ("a"/"f" tasks) (malloc?, slot) in order
        self.order = [(t[0] == "a", t[2] - slot_base) for t in tasks if t[0] in ("a", "f")]
        # the rows and allocator schedules of watched runs, newest first (a loop that keeps the last
        # call's outputs while making the next alternates between two allocator states)
        self.fast: list = []

    # ------------------------------------------------------------------- recording
    @classmethod
    def record(cls, rt, start: int, end: int, *, streams: dict, launch, events: dict, inputs: list,
               fixed: list, windows: list, caller, watch: Optional[Watch] = None) -> "Stretch":
        """The templates of ``rt.trace.log[start:end]``.  ``streams``: sid -> StreamState the stretch
        may use besides ``launch`` (the calling stream, mapped to each run's); ``events``: eid ->
        EventState; ``inputs``/``fixed``: the Blocks (or None) spans may lie in besides the stretch's
        own; ``windows``: sorted ``(first seq, end seq, site)`` of the stretches recorded under a site
        hint; ``caller``: the line that called the graph; ``watch``: the allocator watched since ``start``
        (``watch_recording``), to apply its mallocs and frees at once on later runs (``FastRun``)."""
        trace = rt.trace
        objects = trace.objects
        log = trace.log
        base_of: dict = {}            # bid -> base index
        for i, block in enumerate(inputs):
            if block is not None:
                base_of.setdefault(block.bid, i)
        for j, block in enumerate(fixed):
            base_of.setdefault(block.bid, len(inputs) + j)
        los = {b.bid: b.lo for b in list(inputs) + list(fixed) if b is not None}
        slot_base = len(inputs) + len(fixed)
        next_base = slot_base
        live: set = set()
        stream_of = dict(streams)
        stream_of[launch.sid] = launch
        starts = [w[0] for w in windows]

        def site_at(seq, site):
            i = bisect.bisect_right(starts, seq) - 1
            hinted = i >= 0 and seq < windows[i][1]
            if not hinted:
                return CALLER if site == caller else site
            if site == caller and site != windows[i][2]:
                raise Unplannable(f"a record inside a node carries the caller's line ({site})")
            return site

        def stream(sid):
            s = stream_of.get(sid)
            if s is None:
                raise Unplannable(f"work on a stream outside the graph ({trace.streams[sid].label})")
            return s

        def specs(rows):
            out = []
            for row in rows:
                base = base_of.get(row[3])
                if base is None:
                    raise Unplannable(f"a task uses memory of block {row[3]}, which the graph did not allocate")
                lo = los[row[3]]
                out.append((base, row[1] - lo, row[2] - lo, row[0], row[4:]))
            return tuple(out)

        tasks = []
        slots = []                    # (bid, lo, size, stream, requested, device) of each allocation
        for seq in range(start, end):
            row = log[seq]
            if type(row) is tuple:
                kind = row[0]
                if kind == KERNEL_ROW:
                    _, sid, op, reads, writes, site_i, cores_i, cube, vector, graph_i, collective = row
                    if graph_i is not None or collective is not None:
                        raise Unplannable(f"{op} is a graph replay or a collective")
                    tasks.append(("k", stream(sid), op, specs(reads), specs(writes),
                                  site_at(seq, objects[site_i]), objects[cores_i], cube, vector))
                elif kind == ALLOC_ROW:
                    bid = row[1]
                    info = trace.block_log[bid]
                    if type(info) is not tuple:
                        info = (info.bid, info.device, info.stream, info.lo, info.hi, info.size,
                                trace.intern(info.site), info.pool)
                    if info[7] is not None:
                        raise Unplannable("an allocation in a graph pool")
                    base_of[bid] = next_base
                    los[bid] = info[3]
                    slots.append((bid, info[3], info[4] - info[3], info[2], info[5], info[1], row[3]))
                    live.add(next_base)
                    tasks.append(("a", stream(info[2]), next_base, info[5], info[1],
                                  site_at(seq, objects[row[2]])))
                    next_base += 1
                elif kind == FREE_ROW:
                    base = base_of.get(row[1])
                    if base not in live:
                        raise Unplannable(f"a free of block {row[1]}, which the graph did not allocate")
                    live.discard(base)
                    tasks.append(("f", None, base, site_at(seq, objects[row[2]])))
                else:
                    raise Unplannable(f"an unknown row {row!r}")
                continue
            kind = type(row)
            if kind is T.EventRecord or kind is T.EventWait:
                event = events.get(row.event)
                if event is None:
                    raise Unplannable(f"an event made while the graph ran ({trace.events[row.event].label})")
                tasks.append(("r" if kind is T.EventRecord else "w", stream(row.stream), event,
                              site_at(seq, row.site)))
            elif kind is T.HostSync and row.what == "stream":     # a blocking copy of a host constant
                tasks.append(("h", stream(row.stream), site_at(seq, row.site)))
            elif kind in _MARKERS:
                tasks.append(("m", stream(row.stream), kind, row.facts(), site_at(seq, row.site)))
            else:
                raise Unplannable(f"a {kind.__name__} record")
        stretch = cls(tasks, len(inputs), list(fixed), slot_base, live, base_of)
        if watch is not None and all(slot[5] == watch.allocator.device for slot in slots):
            watch.rows = start + len(tasks)
            schedule = watch.finish([(bid, lo, size, slot_base + k not in live)
                                     for k, (bid, lo, size, _, _, _, _) in enumerate(slots)],
                                    [slot[3] for slot in slots], [slot[4] for slot in slots], end,
                                    stretch.order, [slot[6] for slot in slots], rt.freed_ranges.get(watch.allocator.device))
            if schedule is not None:
                stretch.fast = [FastRun(rt, stretch, schedule, launch, launch)]
        return stretch

    @staticmethod
    def watch_recording(rt, device: int) -> Optional[Watch]:
        """A watch of ``device``'s allocator for a run about to be recorded (``record``'s ``watch``)."""
        return Watch.start_if_possible(rt.devices[device].allocator, None, 0, rt.freed_ranges.get(device))

    # ---------------------------------------------------------------------- runs
    def append(self, rt, launch, origin, inputs: list, caller) -> list:
        """Append the templates for one run on ``launch`` (the recorded calling stream ``origin``
        maps to it), the spans moved onto ``inputs`` (Blocks, as given to ``record``) and this run's
        own blocks.  Returns the Block of every base (the live slots' blocks are the outputs')."""
        from .graphs import append_tasks

        for fast in self.fast:
            if fast.launch is launch and fast.trace is rt.trace:
                blocks = fast.run(rt, inputs, caller)
                if blocks is not None:
                    return blocks
        memory = Memory(rt, self, inputs)
        watch = self._watch(rt, launch, origin)
        start = len(rt.trace.log)
        append_tasks(rt, self.tasks, origin, launch, memory=memory, caller=caller)
        if watch is not None:
            streams = [(launch if s is origin else s).sid for s, _, _ in self.allocs]
            reuses = [row[3] if type(row) is tuple else row.reuses for row in rt.trace.log[start:]
                      if (row[0] == ALLOC_ROW if type(row) is tuple else type(row) is T.Alloc)]
            schedule = watch.finish([(b.bid, b.lo, b.size, b.freed) for b in memory.blocks[self.slot_base:]],
                                    streams, [n for _, n, _ in self.allocs], len(rt.trace.log), self.order,
                                    reuses, rt.freed_ranges.get(watch.allocator.device))
            if schedule is not None:
                self.fast = [FastRun(rt, self, schedule, launch, origin)] + self.fast[:SCHEDULES - 1]
        return memory.blocks

    def _watch(self, rt, launch, origin) -> Optional[Watch]:
        """A watch of the allocator for the run about to be made (None: it cannot make a schedule)."""
        devices = {d for _, _, d in self.allocs}
        if len(devices) > 1:
            return None
        device = devices.pop() if devices else launch.device
        keys = {pool_key((launch if s is origin else s).sid, n) for s, n, _ in self.allocs}
        return Watch.start_if_possible(rt.devices[device].allocator, keys, len(rt.trace.log) + len(self.tasks),
                                       rt.freed_ranges.get(device))


def base_slots(rt, stretch: Stretch, inputs: list):
    """The addresses, block ids and blocks of a run's first ``stretch.slot_base`` slots: the inputs' blocks
    (made known to ``rt`` when another runtime's allocator made them), then the stretch's fixed blocks."""
    n = stretch.slot_base
    los, bids, blocks = [0] * n, [0] * n, [None] * n
    for i, block in enumerate(inputs):
        if block is not None:
            los[i], bids[i], blocks[i] = block.lo, block.bid, block
            if block.allocator.runtime is not rt:
                rt.known_block(block)
    for j, block in enumerate(stretch.fixed, stretch.n_inputs):
        los[j], bids[j], blocks[j] = block.lo, block.bid, block
    return los, bids, blocks


class Memory:
    """One run's blocks: the bases' addresses and ids, malloc and free of the slots."""

    __slots__ = ("rt", "los", "bids", "blocks", "thread")

    def __init__(self, rt, stretch: Stretch, inputs: list):
        self.rt = rt
        self.los, self.bids, self.blocks = base_slots(rt, stretch, inputs)
        self.thread = rt.thread()

    def spans(self, specs) -> tuple:
        los, bids = self.los, self.bids
        return tuple([(device, los[b] + dlo, los[b] + dhi, bids[b]) if not extra else
                      (device, los[b] + dlo, los[b] + dhi, bids[b]) + extra for b, dlo, dhi, device, extra in specs])

    def malloc(self, stream, base: int, nbytes: int, device: int, site) -> None:
        rt = self.rt
        block = rt.devices[device].allocator.malloc(nbytes, stream.sid, None)
        self.los.append(block.lo)
        self.bids.append(block.bid)
        self.blocks.append(block)
        rt.on_alloc(block, site)

    def free(self, base: int, site) -> None:
        block = self.blocks[base]
        thread = self.thread
        thread.site = site          # the Free's line (on_free reads the site hint first)
        try:
            block.allocator.free(block)
        finally:
            thread.site = None


class FastRun:
    """A stretch's run without per-task work: the allocator's part applied at once
    (``alloc_schedule.AllocSchedule``), and the trace rows built from templates whose interned sites,
    profiles and streams are resolved once (valid for one trace and calling stream).  Each distinct
    span of the run's kernels is made once per run; a kernel's reads and writes pick theirs."""

    __slots__ = ("trace", "launch", "origin", "schedule", "stretch", "program", "device", "n_slots", "los",
                 "specs", "runs")

    def __init__(self, rt, stretch: Stretch, schedule, launch, origin):
        trace = rt.trace
        intern = trace.intern
        self.trace, self.launch, self.origin, self.schedule, self.stretch = trace, launch, origin, schedule, stretch
        self.device = schedule.allocator.device
        slot_base = stretch.slot_base
        self.n_slots = len(schedule.spans)
        self.los = [lo for lo, _ in schedule.spans]
        specs: dict = {}            # span spec (base, dlo, dhi, device, extra) -> its index in a run's spans
        program, rows, marks = [], [], {}

        def site_of(site):
            return None if site is CALLER else intern(site)

        def pick(spans):
            """What picks a kernel's spans out of the run's: None (none), an index (one) or an itemgetter."""
            idx = tuple(specs.setdefault(spec, len(specs)) for spec in spans)
            return None if not idx else idx[0] if len(idx) == 1 else operator.itemgetter(*idx)

        def reused(k):
            """An allocation's ``Alloc.reuses``: a base (a block of the run: the newest is the largest id),
            or the (region, index) of the freed ranges it takes (``AllocSchedule.ranges_match``), or None."""
            tags = schedule.sources[k]
            mine = [tag[1] for tag in tags if tag[0] == 1]
            if mine:
                return slot_base + max(mine)
            return tuple((tag[1], tag[2]) for tag in tags) or None

        for task in stretch.tasks:
            s = launch if task[1] is origin else task[1]
            kind = task[0]
            if kind == "k":
                marks[s.sid] = len(rows)
                rows.append((0, s.sid, task[2], pick(task[3]), pick(task[4]), site_of(task[5]), intern(task[6]),
                             task[7], task[8]))
            elif kind == "a":
                k = task[2] - slot_base
                lo, hi = schedule.spans[k]
                rows.append((1, task[2], reused(k), lo, hi, s.sid, task[3], site_of(task[5])))
            elif kind == "f":
                rows.append((2, task[2], site_of(task[3])))
            else:
                if rows:
                    program.append((tuple(rows), tuple(marks.items())))
                    rows, marks = [], {}
                program.append((None, (kind, s) + task[2:]))
        if rows:
            program.append((tuple(rows), tuple(marks.items())))
        self.program = program
        self.specs = list(specs)
        self.runs = 0                   # runs made so (tests: the path was taken)

    def run(self, rt, inputs: list, caller) -> Optional[list]:
        """Append one run (as ``Stretch.append``), or None when the allocator is not in the state the
        schedule starts from (the caller then runs it task by task)."""
        stretch, schedule = self.stretch, self.schedule
        a = schedule.allocator
        trace = rt.trace
        device = self.device
        with rt.lock:
            a._busy += 1        # no finalizer's free between the check and the change
            try:
                if not schedule.matches():
                    return None
                found = schedule.ranges_match(rt.freed_ranges.get(device))
                if found is None:
                    return None
                slot_bids = rt.new_block_ids(self.n_slots)
                live = schedule.apply(slot_bids)
                schedule.update_ranges(rt, device, found, slot_bids)
            finally:
                a._busy -= 1
                while a._deferred and not a._busy:
                    a.free(a._deferred.pop())
            L, B, blocks = base_slots(rt, stretch, inputs)
            L.extend(self.los)
            B.extend(slot_bids)
            blocks.extend(map(live.get, range(self.n_slots)))
            U = [(d, L[b] + dlo, L[b] + dhi, B[b]) + x for b, dlo, dhi, d, x in self.specs]
            caller_i = None if caller is None else trace.intern(caller)
            log, block_log, marks = trace.log, trace.block_log, rt.stream_marks
            for templates, last in self.program:
                if templates is None:
                    kind, s = last[0], last[1]
                    site = caller if last[-1] is CALLER else last[-1]
                    if kind == "r":
                        rt._record_now(last[2], s, site)
                    elif kind == "w":
                        rt._wait_now(last[2], s, site)
                    elif kind == "h":
                        rt.host_sync("stream", device=s.device, stream=s, site=site)
                    else:
                        rt.marker(last[2], s, site, **last[3])
                    continue
                rows = []
                add = rows.append
                for t in templates:
                    kind = t[0]
                    if kind == 0:
                        r, w, site_i = t[3], t[4], t[5]
                        add((KERNEL_ROW, t[1], t[2],
                             () if r is None else (U[r],) if r.__class__ is int else r(U),
                             () if w is None else (U[w],) if w.__class__ is int else w(U),
                             caller_i if site_i is None else site_i, t[6], t[7], t[8], None, None))
                    elif kind == 1:
                        _, base, src, lo, hi, sid, nbytes, site_i = t
                        bid = B[base]
                        if site_i is None:
                            site_i = caller_i
                        block_log[bid] = (bid, device, sid, lo, hi, nbytes, site_i, None)
                        add((ALLOC_ROW, bid, site_i, None if src is None else B[src] if src.__class__ is int
                             else max([found[i][j] for i, j in src])))
                    else:
                        add((FREE_ROW, B[t[1]], caller_i if t[2] is None else t[2]))
                seq = len(log)       # (not before the rows are made: a finalizer's free may append meanwhile)
                log.extend(rows)
                for sid, i in last:
                    marks[sid] = seq + i
        self.runs += 1
        return blocks
