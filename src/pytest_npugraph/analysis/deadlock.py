"""Deadlock: streams and devices that can block each other forever (docs/reference.md, "Hazards": ``deadlock``).

Why: an op whose blocks must all be resident at once (NonZero, AIV-mode collectives, MC2)
holds the cores it got while it waits for the rest; a collective holds its cores until its
peers on the other devices arrive.  Two cards can then wait on each other for ever (seed
000: reduce-scatter and dispatch/combine take 16 + 24 of 48 vector cores, NonZero takes
the rest).  Whether that happens depends on which ready op grabs cores first, so one
simulated schedule proves nothing: this module searches every schedule.

Model (the transition system searched; tests/analysis_cores/oracle.py restates it naively)
------------------------------------------------------------------------------------------
The task graph (taskgraph.py) gives each stream a FIFO of tasks and each task its extra
prerequisites (the event record it waits for, host-synced work).  A task at the head of
its stream whose prerequisites completed can take one *step*:

* ``EventRecord`` / ``EventWait``: completes.
* A resident op (``all_resident`` with blocks > 0; blocks = taskgraph.blocks): grabs every
  free core it still lacks, per pool, and holds them (a step must take at least one core).
  Once it holds all its blocks it runs: an ordinary op completes and frees them at once; a
  collective has *arrived* and keeps holding them.
* Any other op needs one free core in each pool it uses (none if it uses none): its blocks
  run in waves on whatever cores free up and it never holds cores while waiting for
  anything, so it cannot be half-started; it completes (a collective arrives, holding
  nothing).
* When every member of a collective ``(group, seq)`` on every device of the group has
  arrived, all complete together and free their cores (one step).

Any enabled step may happen next; the competing kernels' blocks are dispatched kernel by
kernel (the order is searched), not interleaved block by block: a split that leaves every
competitor short on one device is what the ``core-limit`` check reports statically.  A
reachable state where no step is enabled while work remains is a deadlock.

Search: breadth-first over states ``(stream positions, cores held by each stream head,
arrived flags)`` with a visited set, and reductions that keep every deadlock:

* *safe steps* run at once, without branching: event steps, ops using no cores, and core
  steps no order can change.  Statically: the op's blocks plus the largest resident demand
  of each other stream that may overlap it fit the pool, and so do those of every op it
  may overlap.  Dynamically: every op that may still overlap it on that pool is an arrived
  collective, which can only free cores, so the step stays enabled and loses nothing by
  going first;
* the remaining steps are only interleaved within one *cluster* of devices: a device plus
  every device its stream heads wait on (the peers of an arrived collective, cross-device
  prerequisites), transitively.  Until one of its heads waits on them, steps of other
  devices touch none of its state, so its enabled steps form a persistent set (Godefroid
  1996); the smallest cluster's steps are explored;
* interchangeable devices (SPMD ranks: same pools, same tasks stream by stream, no
  cross-device prerequisite) are folded: states equal up to swapping them are one state.

The state graph is acyclic (every step makes progress), so persistent sets need no cycle
proviso.  The naive oracle in tests/analysis_cores checks all of this against plain DFS.

The search stops at the first deadlock, or after ``budget`` distinct states: then ``find``
reports nothing and logs a warning on ``pytest_npugraph.analysis.deadlock``;
``explore`` returns the verdict with ``complete=False`` for callers that surface it.

Collectives issued in different orders: the runtime matches collectives by (group, seq),
so ranks issuing all_reduce / all_gather in different orders pair the wrong ops.
``collective_mismatch`` turns one such (group, seq) into a hazard (the runtime may call it
when it matches a collective); ``find`` applies it to every collective of the trace.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from ..hazard import Hazard
from ..trace import Trace
from . import contents, describe, taskgraph
from .taskgraph import CUBE, TYPE_NAMES, TYPES, VECTOR, RangeMax, Task, TaskGraph, stream_name

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 50_000
EMPTY = (0, 0, False)  # cores held (cube, vector) by a stream's head, and "arrived"


@dataclass(frozen=True)
class Exploration:
    """Verdict of the search: ``stuck`` is a reachable deadlocked state, if one was found."""

    states: int
    complete: bool
    stuck: Optional[tuple] = None  # (positions, held)


# ----------------------------------------------------------------------- public API
def find(trace: Trace, cache: Optional[dict] = None, budget: int = DEFAULT_BUDGET) -> list:
    """Deadlock hazards of ``trace``: mismatched collectives and a reachable circular wait."""
    if contents.of(trace, cache).no_deadlock:
        return []       # no collective, and no two streams of a device with a resident op (contents.py)
    graph = taskgraph.of(trace, cache)
    hazards = _mismatches(graph)
    result = Search(graph).run(budget)
    if result.stuck is not None:
        hazards.append(report(graph, *result.stuck))
    elif not result.complete:
        log.warning("deadlock search stopped after %d states (budget %d) without finding a "
                    "deadlock; schedules not reached were not checked", result.states, budget)
    return hazards


def explore(trace: Trace, budget: int = DEFAULT_BUDGET) -> Exploration:
    """The raw verdict, with the number of states visited and whether the search finished."""
    return Search(taskgraph.build(trace)).run(budget)


P2P = frozenset({"hccl::send", "hccl::recv"})   # a point-to-point channel pairs a send with a receive


def collective_mismatch(trace: Trace, kernels) -> Optional[Hazard]:
    """A hazard if the kernels matched as one collective (same ``(group, seq)``) are not all
    the same op: the ranks issue the group's collectives in different orders."""
    kernels = sorted(kernels, key=lambda k: (describe.stream_key(trace, k.stream), k.seq))
    ops = {k.op for k in kernels}
    if len(ops) < 2 or ops == P2P:
        return None
    group, seq = kernels[0].collective
    parts = ", ".join(f"{k.op} on {stream_name(trace, k.stream)} ({k.site})" for k in kernels)
    return Hazard(
        "deadlock",
        f"collective #{seq} of group {group!r} is not the same op on every rank: {parts}. "
        f"The ranks issue this group's collectives in different orders; HCCL pairs them by "
        f"order, so each rank waits in a different collective (a hang, or buffers of the "
        f"wrong op exchanged). Fix: issue the group's collectives in the same order on "
        f"every rank.",
        where=_unique(str(k.site) for k in kernels),
        streams=_unique(stream_name(trace, k.stream) for k in kernels),
        ops=_unique(k.op for k in kernels),
        seqs=tuple(k.seq for k in kernels))


def _mismatches(graph: TaskGraph) -> list:
    """The first mismatched collective of each group (later ones follow from it)."""
    first: dict = {}
    for key in sorted(graph.collectives, key=lambda k: (str(k[0]), k[1])):
        if key[0] not in first:
            hazard = collective_mismatch(graph.trace, [graph.tasks[t].rec for t in graph.collectives[key]])
            if hazard is not None:
                first[key[0]] = hazard
    return list(first.values())


def _unique(items) -> list:
    return list(dict.fromkeys(items))


# ------------------------------------------------------------------------- search
class Search:
    """The transition system of one task graph, and the reduced breadth-first search."""

    def __init__(self, graph: TaskGraph) -> None:
        self.g = graph
        self.lanes = [[graph.tasks[t] for t in tids] for tids in graph.lanes]
        self.dev_lanes = graph.device_lanes

    # -- state helpers (positions and held are tuples, or lists while a step is applied)
    def head(self, pos, lane) -> Optional[Task]:
        tasks = self.lanes[lane]
        return tasks[pos[lane]] if pos[lane] < len(tasks) else None

    def done(self, pos, tid) -> bool:
        t = self.g.tasks[tid]
        return pos[t.lane] > t.pos

    def free(self, held, device) -> list:
        free = list(self.g.pools[device])
        for lane in self.dev_lanes[device]:
            free[CUBE] -= held[lane][CUBE]
            free[VECTOR] -= held[lane][VECTOR]
        return free

    def peers_ready(self, pos, held, key) -> bool:
        """Every device of the group has a member of collective ``key``, all arrived."""
        tids = self.g.collectives[key]
        if not self.g.members[key[0]] <= {self.g.device(self.g.tasks[t]) for t in tids}:
            return False
        for tid in tids:
            t = self.g.tasks[tid]
            if pos[t.lane] != t.pos or not held[t.lane][2]:
                return False
        return True

    # -- steps
    def next(self, pos, held, lane) -> Optional[tuple]:
        """The lane's (position, held) after its head's step, or None if it cannot step."""
        t = self.head(pos, lane)
        if t is None or not all(self.done(pos, d) for d in t.deps):
            return None
        if t.kernel is None:
            return pos[lane] + 1, EMPTY
        c, v, arrived = held[lane]
        if arrived:
            return None  # waits for its collective peers
        need = t.need
        if need != (0, 0):
            free = self.free(held, self.g.device(t))
            if t.resident:
                take_c, take_v = min(free[CUBE], need[CUBE] - c), min(free[VECTOR], need[VECTOR] - v)
                if take_c <= 0 and take_v <= 0:
                    return None
                c, v = c + max(take_c, 0), v + max(take_v, 0)
                if (c, v) != need:
                    return pos[lane], (c, v, False)
            elif any(need[k] and free[k] < 1 for k in TYPES):
                return None
        return (pos[lane], (c, v, True)) if t.collective is not None else (pos[lane] + 1, EMPTY)

    def step(self, pos, held, lane) -> bool:
        moved = self.next(pos, held, lane)
        if moved is not None:
            pos[lane], held[lane] = moved
        return moved is not None

    def complete(self, pos, held, key) -> bool:
        if not self.peers_ready(pos, held, key):
            return False
        for tid in self.g.collectives[key]:
            lane = self.g.tasks[tid].lane
            pos[lane] += 1
            held[lane] = EMPTY
        return True

    def arrived_keys(self, pos, held) -> list:
        return _unique(self.head(pos, lane).collective
                       for lane in range(len(self.lanes)) if held[lane][2])

    # -- reductions
    def settle(self, pos, held) -> tuple:
        """Run every safe step until none is enabled (their order does not matter), and
        return the canonical form of the state reached."""
        pos, held = list(pos), list(held)
        for key in self.arrived_keys(pos, held):  # arrived in the step just taken
            if self.safe[key]:
                self.complete(pos, held, key)
        dirty = set(self.dev_lanes)  # devices where a step may have become enabled
        while dirty:
            device = dirty.pop()
            for lane in self.dev_lanes[device]:
                while True:
                    t = self.head(pos, lane)
                    if (t is None or held[lane][2] or not (self.safe[t.tid] or self.uncontested(pos, held, t))
                            or not self.step(pos, held, lane)):
                        break
                    dirty.add(device)
                    dirty |= self.woken[t.tid]
                    key = t.collective if held[lane][2] else None
                    if key is not None and self.safe[key] and self.complete(pos, held, key):
                        dirty |= self.devices(("key", key))
        return self.canonical(pos, held)

    def uncontested(self, pos, held, t: Task) -> bool:
        """Every op that may still overlap ``t`` on a pool ``t`` still wants is an arrived
        collective: nothing can take those cores before ``t`` (others only free them), so
        its step cannot be disabled and no order matters."""
        for k in TYPES:
            if t.need[k] <= (held[t.lane][k] if t.resident else 0):
                continue
            for lane, lo, hi in self.windows[t.tid]:
                first = max(lo, pos[lane])
                users = self._users[lane, k]
                count = users[hi] - users[first] if first < hi else 0
                if count and not (count == 1 and first == pos[lane] and held[lane][2]
                                  and self.lanes[lane][first].need[k]):
                    return False
        return True

    def canonical(self, pos, held) -> tuple:
        """Interchangeable devices (``orbits``) sorted by their own part of the state."""
        for orbit in self.orbits:
            parts = sorted(tuple((pos[ln], held[ln]) for ln in lanes) for lanes in orbit)
            for lanes, part in zip(orbit, parts):
                for ln, (p, h) in zip(lanes, part):
                    pos[ln], held[ln] = p, h
        return tuple(pos), tuple(held)

    def enabled(self, pos, held) -> list:
        """The steps (``("lane", i)`` / ``("key", k)``) enabled in a settled state."""
        steps = [("lane", lane) for lane in range(len(self.lanes))
                 if self.next(pos, held, lane) is not None]
        steps += [("key", key) for key in self.arrived_keys(pos, held)
                  if self.peers_ready(pos, held, key)]
        return steps

    def devices(self, step) -> set:
        kind, what = step
        if kind == "lane":
            return {self.g.lane_device[what]}
        return {self.g.device(self.g.tasks[t]) for t in self.g.collectives[what]}

    def cluster(self, pos, held, device) -> set:
        """``device`` and every device its stream heads (transitively) wait on: the devices
        of unfinished prerequisites, and the peers of collectives that have arrived (one that
        has not arrived cannot complete without a step of its own device)."""
        cluster, work = {device}, [device]
        while work:
            for lane in self.dev_lanes[work.pop()]:
                t = self.head(pos, lane)
                if t is None:
                    continue
                wanted = {self.g.device(self.g.tasks[d]) for d in t.deps if not self.done(pos, d)}
                if held[lane][2]:
                    wanted |= self.g.members[t.collective[0]]
                    wanted |= self.devices(("key", t.collective))
                for dev in wanted - cluster:
                    cluster.add(dev)
                    work.append(dev)
        return cluster

    def persistent(self, pos, held, steps) -> list:
        best = steps
        for device in {d for s in steps for d in self.devices(s)}:
            cluster = self.cluster(pos, held, device)
            chosen = [s for s in steps if self.devices(s) & cluster]
            if len(chosen) < len(best):
                best = chosen
        return best

    def apply(self, state, step) -> tuple:
        pos, held = list(state[0]), list(state[1])
        kind, what = step
        (self.step if kind == "lane" else self.complete)(pos, held, what)
        return self.settle(pos, held)

    def run(self, budget: int = DEFAULT_BUDGET) -> Exploration:
        start = self.settle([0] * len(self.lanes), [EMPTY] * len(self.lanes))
        visited, queue = {start}, deque([start])
        while queue:  # breadth first: the deadlock reported is one reached in fewest steps
            state = queue.popleft()
            steps = self.enabled(*state)
            if not steps:
                if any(self.head(state[0], lane) is not None for lane in range(len(self.lanes))):
                    return Exploration(len(visited), True, state)
                continue
            for step in self.persistent(*state, steps):
                nxt = self.apply(state, step)
                if nxt not in visited:
                    if len(visited) >= budget:
                        return Exploration(len(visited), False)
                    visited.add(nxt)
                    queue.append(nxt)
        return Exploration(len(visited), True)

    # -- static facts about the task graph, computed once
    @cached_property
    def woken(self) -> list:
        """``tid -> devices`` whose tasks wait for it across devices (events, syncs)."""
        out = [set() for _ in self.g.tasks]
        for t in self.g.tasks:
            for d in t.deps:
                if self.g.device(self.g.tasks[d]) != self.g.device(t):
                    out[d].add(self.g.device(t))
        return out

    @cached_property
    def windows(self) -> list:
        """``tid -> [(lane, lo, hi)]``: what may overlap it on the other streams of its device."""
        return [list(self.g.overlapping(t)) if t.need != (0, 0) else [] for t in self.g.tasks]

    @cached_property
    def _users(self) -> dict:
        """``(lane, k) -> prefix counts`` of the lane's ops that use pool ``k``."""
        return self._prefix_counts(lambda t, k: t.need[k] > 0)

    def _prefix_counts(self, predicate) -> dict:
        out = {}
        for lane, tasks in enumerate(self.lanes):
            for k in TYPES:
                counts = [0]
                for t in tasks:
                    counts.append(counts[-1] + bool(predicate(t, k)))
                out[lane, k] = counts
        return out

    @cached_property
    def orbits(self) -> list:
        """Groups of devices that are interchangeable: the same pools and, stream by stream,
        the same tasks (needs, residency, collective keys, prerequisites), and no
        prerequisite crossing to or from another device.  Swapping two of them maps every
        schedule to a schedule, so states equal up to such swaps are explored once (SPMD
        ranks are the common case)."""
        groups: dict = {}
        linked = {self.g.device(self.g.tasks[d]) for t in self.g.tasks for d in t.deps
                  if self.g.device(self.g.tasks[d]) != self.g.device(t)}
        linked |= {self.g.device(t) for t in self.g.tasks for d in t.deps
                   if self.g.device(self.g.tasks[d]) != self.g.device(t)}
        for device, lanes in sorted(self.dev_lanes.items()):
            if device in linked:  # a cross-device prerequisite names this very device
                continue
            local = {lane: i for i, lane in enumerate(lanes)}

            def prerequisite(tid: int) -> tuple:
                t = self.g.tasks[tid]
                return local[t.lane], t.pos

            signature = (self.g.pools[device], tuple(
                tuple((type(t.rec).__name__, t.need, t.resident, t.collective,
                       tuple(map(prerequisite, t.deps))) for t in self.lanes[lane])
                for lane in lanes))
            groups.setdefault(signature, []).append(lanes)
        return [orbit for orbit in groups.values() if len(orbit) > 1]

    @cached_property
    def _resident_max(self) -> dict:
        return {(lane, k): RangeMax([t.need[k] if t.resident else 0 for t in tasks])
                for lane, tasks in enumerate(self.lanes) for k in TYPES}

    def overlap_demand(self, t: Task, k: int) -> int:
        """At most how many cores of pool ``k`` other streams' resident ops hold while ``t``
        is in flight: the largest such demand per stream, summed."""
        return sum(self._resident_max[lane, k](lo, hi) for lane, lo, hi in self.windows[t.tid])

    def overlap_peaks(self, t: Task, k: int) -> list:
        """The ops behind ``overlap_demand``: per other stream, its largest overlapping one."""
        peaks = []
        for lane, lo, hi in self.windows[t.tid]:
            window = [u for u in self.lanes[lane][lo:hi] if u.resident and u.need[k]]
            if window:
                peaks.append(max(window, key=lambda u: u.need[k]))
        return peaks

    @cached_property
    def safe(self) -> dict:
        """``tid -> bool`` for stream steps and ``(group, seq) -> bool`` for completions.

        A core step of op ``t`` on pool P is order-independent when P cannot run short
        while ``t`` may be in flight: ``t``'s blocks (1 for a non-resident op) plus, for
        each other stream of its device, the largest resident demand on P among the ops
        that may overlap ``t``, fit P (``fits``).  A resident op's grab, or a completion
        freeing cores, changes what others get, so it is safe only if every op it may
        overlap on the pools it uses fits too (``quiet``)."""
        g = self.g

        def fits(t: Task) -> bool:
            pool = g.pool(t)
            return all((t.need[k] if t.resident else 1) + self.overlap_demand(t, k) <= pool[k]
                       for k in TYPES if t.need[k])

        fit = {t.tid: fits(t) for t in g.tasks}
        short_before = self._prefix_counts(lambda t, k: t.need[k] and not fit[t.tid])

        def quiet(t: Task) -> bool:
            return all(short_before[lane, k][hi] == short_before[lane, k][lo]
                       for lane, lo, hi in self.windows[t.tid] for k in TYPES if t.need[k])

        safe: dict = {}
        for t in g.tasks:
            safe[t.tid] = t.need == (0, 0) or (fit[t.tid] and (not t.resident or quiet(t)))
        for key, tids in g.collectives.items():
            safe[key] = all(quiet(g.tasks[t]) for t in tids if g.tasks[t].resident)
        return safe


# ------------------------------------------------------------------------- report
def report(graph: TaskGraph, pos: tuple, held: tuple) -> Hazard:
    """Explain a deadlocked state: what each blocked op waits for, the circular wait
    (networkx wait-for graph), and how to break it."""
    return _Explanation(Search(graph), pos, held).hazard()


class _Explanation:
    """The wait-for graph of a stuck state.  Nodes are tasks (and a missing peer); an edge
    ``a -> b`` means ``a`` cannot proceed until ``b`` does: ``b`` holds cores ``a`` needs,
    is a peer ``a``'s collective waits for, is a prerequisite of ``a``, or is the head
    a waited-for task is queued behind on its stream."""

    def __init__(self, search: Search, pos: tuple, held: tuple) -> None:
        import networkx as nx

        self.search, self.g, self.pos, self.held = search, search.g, pos, held
        self.heads = {lane: t for lane in range(len(search.lanes))
                      if (t := search.head(pos, lane)) is not None}
        self.wfg = nx.DiGraph()
        self.reasons = {lane: self.wait(lane, t) for lane, t in self.heads.items()}

    def edge(self, tid: int, node) -> None:
        """``tid`` waits for ``node``, which waits for its stream's head if queued."""
        self.wfg.add_edge(tid, node)
        if isinstance(node, int):
            head = self.heads.get(self.g.tasks[node].lane)
            if head is not None and head.tid != node:
                self.wfg.add_edge(node, head.tid)

    def wait(self, lane: int, t: Task) -> str:
        """Add ``t``'s edges; say what it waits for."""
        g, held = self.g, self.held
        self.wfg.add_node(t.tid)
        pending = [d for d in t.deps if not self.search.done(self.pos, d)]
        if pending:
            for d in pending:
                self.edge(t.tid, d)
            return "waits for " + ", ".join(g.describe(g.tasks[d]) for d in pending)
        if held[lane][2]:
            return self.peers(t)
        free = self.search.free(held, g.device(t))
        short = [k for k in TYPES if t.need[k] > held[lane][k] and free[k] < 1]
        holders = [h for ln in self.search.dev_lanes[g.device(t)] if ln != lane
                   and (h := self.heads.get(ln)) and any(held[ln][k] for k in short)]
        for h in holders:
            self.edge(t.tid, h.tid)
        held_by = ", ".join(f"{g.describe(h)} holds {_cores(held[h.lane], short)}" for h in holders)
        if t.resident:
            return (f"needs all its {_cores(t.need)} blocks resident at once and holds "
                    f"{_cores(held[lane]) or 'none'}; no core is free: {held_by}")
        return f"needs a free {'/'.join(TYPE_NAMES[k] for k in short)} core; {held_by}"

    def peers(self, t: Task) -> str:
        g, key = self.g, t.collective
        members = {g.device(g.tasks[m]): g.tasks[m] for m in g.collectives[key]}
        waiting = []
        for device in sorted(g.members[key[0]] | set(members)):
            m = members.get(device)
            if m is None:
                self.edge(t.tid, ("missing", key, device))
                waiting.append(f"npu:{device}, which never issues it")
                continue
            ahead = self.heads.get(m.lane)
            if ahead is m and self.held[m.lane][2]:
                continue
            self.edge(t.tid, m.tid)
            waiting.append(g.describe(m) + (f", queued behind {g.describe(ahead)}" if ahead is not m else ""))
        have = _cores(t.need)
        return (f"collective {key[0]!r}#{key[1]} arrived{' holding ' + have if have else ''}; "
                f"waits for its peers: " + "; ".join(waiting))

    def name(self, node) -> str:
        if isinstance(node, tuple):
            return f"npu:{node[2]} (never issues collective {node[1][0]!r}#{node[1][1]})"
        t = self.g.tasks[node]
        key = f"[{t.collective[0]}#{t.collective[1]}]" if t.collective else ""
        return f"{t.rec.op if t.kernel else type(t.rec).__name__}{key}@{self.g.stream_label(t.lane)}"

    def order(self, node) -> tuple:
        """Sort key of a node: device, lane, position (a missing peer first on its device)."""
        if isinstance(node, tuple):
            return (node[2], -1, 0)
        t = self.g.tasks[node]
        return (self.g.device(t), t.lane, t.pos)

    def cycle(self) -> list:
        """The circular wait to show (``circular_wait``): through the hold-and-wait ops, the
        cause the fix addresses; started at its first node by ``order``, so runs read the same."""
        def hold_and_wait(node) -> bool:
            return isinstance(node, int) and _hold_and_wait(self.g.tasks[node])

        return describe.rotated(circular_wait(self.wfg, self.order, hold_and_wait), self.order)

    def fix(self) -> str:
        """On each device where a hold-and-wait op (resident, not a collective: NonZero-like)
        waits for cores, limit it so that it and every resident op that may overlap it fit
        the pool; where that cannot work, order them; with no such op, align and shrink
        the collectives."""
        g, advice = self.g, {}   # (limit?, op, site, what to do) -> streams
        for lane, t in sorted(self.heads.items()):
            for k in TYPES:
                if not (_hold_and_wait(t) and self.held[lane][k] < t.need[k]):
                    continue
                peaks, size = self.search.overlap_peaks(t, k), g.pool(t)[k]
                room = size - sum(u.need[k] for u in peaks)
                if room >= 1 and t.rec.cores.limit_applies:
                    arithmetic = " - ".join([str(size)] + [f"{u.need[k]} {u.rec.op}" for u in peaks])
                    key = (True, t.rec.op, t.rec.site, f"to {room} {TYPE_NAMES[k]} cores ({arithmetic})")
                else:
                    reason = ("a core limit does not take effect on it" if room >= 1 else
                              f"the ops it may overlap already need {size - room} of {size}")
                    key = (False, t.rec.op, t.rec.site, "before or after the ops it competes with (an "
                           f"event recorded on one stream, waited on the other): {reason}")
                advice.setdefault(key, []).append(g.stream_label(lane))

        def say(verb, op, site, what, streams):  # one line for the same call on every rank
            same = f", and the same on {', '.join(streams[1:])}" if len(streams) > 1 else ""
            return f"{verb} {op} on {streams[0]} ({site}) {what}{same}"

        limits = [say("limit", *key[1:], streams) for key, streams in advice.items() if key[0]]
        orders = [say("order", *key[1:], streams) for key, streams in advice.items() if not key[0]]
        if limits:
            orders.insert(0, "; ".join(limits) + " -- with torch.npu.set_stream_limit(stream, "
                          "cube_num=-1, vector_num=N) in eager code or `with torchair.scope."
                          "limit_core_num(aicore, vector):` in graph mode; the ops that can block "
                          "each other must together use no more cores than the device has")
        return "; ".join(orders) or (
            "issue the collectives in the same order on every rank, and give concurrent "
            "collectives few enough cores that they fit together, so that no rank holds cores "
            "in a collective its peers reach only after one they are blocked in")

    def shown(self, cycle: list) -> list:
        """The heads to explain: those on the cycle and the ones holding cores on its
        devices (all heads when there is no cycle); the rest are only counted."""
        g = self.g
        lanes = {g.tasks[n].lane for n in cycle if isinstance(n, int)}
        devices = {g.lane_device[lane] for lane in lanes}
        lanes |= {lane for lane in self.heads if g.lane_device[lane] in devices
                  and any(self.held[lane][k] for k in TYPES)}
        return sorted(lanes & set(self.heads)) or sorted(self.heads)

    def hazard(self) -> Hazard:
        g = self.g
        cycle = self.cycle()
        shown = self.shown(cycle)
        stuck = [self.heads[lane] for lane in shown]
        devices = ", ".join(f"npu:{d}" for d in sorted({g.device(t) for t in self.heads.values()}))
        others = [g.stream_label(lane) for lane in sorted(set(self.heads) - set(shown))]
        message = (
            f"streams on {devices} can block each other forever (found by searching every "
            f"order in which ready ops can take cores); in the reached state nothing can make "
            f"progress:\n" + "\n".join(f"  - {g.describe(self.heads[lane])}: {self.reasons[lane]}"
                                         for lane in shown)
            + (f"\n  ... and {len(others)} more streams blocked behind them: {', '.join(others)}"
               if others else "")
            + ("\n  cycle: " + " -> ".join(map(self.name, cycle + cycle[:1])) if cycle else "")
            + "\n  fix: " + self.fix())
        kernels = [t for t in stuck if t.kernel]
        return Hazard(
            "deadlock", message,
            where=_unique(str(t.rec.site) for t in kernels or stuck),
            streams=_unique(g.stream_label(t.lane) for t in stuck),
            ops=_unique(t.rec.op for t in kernels),
            seqs=tuple(t.rec.seq for t in stuck))


def circular_wait(wfg, key, preferred) -> list:
    """One simple cycle of the directed graph ``wfg`` ([] if it has none), a function of the
    graph alone: ``key`` orders the nodes totally, ``preferred(node)`` marks those the cycle
    should pass through (hold-and-wait ops).

    Why not "the best of the cycles ``nx.simple_cycles`` yields": there may be exponentially
    many, and any prefix of them depends on the order the nodes and edges were added in
    (task ids, hence the ranks' thread timing), so the report changed between runs.  The
    cycle through the most preferred nodes is NP-hard to find (it contains the longest-cycle
    problem), so a greedy walk stands in for it:

    1. the start is the smallest node by (not preferred, ``key``) that lies on a cycle (in a
       strongly connected component with an edge);
    2. from the walk's last node, go to the nearest preferred node not on the walk (ties:
       the smallest by ``key``) from which the start can still be reached without touching
       the walk; a preferred node that cannot be is dropped for good;
    3. when none is left, return to the start.

    Every leg is the shortest path, and of those the first by ``key`` node by node, within
    the component and off the walk, so the cycle is simple.  Each preferred node costs a few
    breadth-first searches: O(P (V + E)) for P preferred nodes, whatever the number of
    cycles.  With no preferred node on a cycle, the result is the shortest cycle through
    the smallest node on a cycle, the first by ``key`` of those."""
    import networkx as nx

    component: dict = {}
    for nodes in nx.strongly_connected_components(wfg):
        if len(nodes) > 1 or any(wfg.has_edge(n, n) for n in nodes):
            component.update(dict.fromkeys(nodes, nodes))
    if not component:
        return []
    start = min(component, key=lambda n: (not preferred(n), key(n)))
    nodes = component[start]
    succ = {n: sorted((m for m in wfg.successors(n) if m in nodes), key=key) for n in nodes}
    pred = {n: sorted((m for m in wfg.predecessors(n) if m in nodes), key=key) for n in nodes}
    free = set(nodes) - {start}                    # nodes not on the walk
    wanted = {n for n in free if preferred(n)}
    walk = [start]
    while wanted:
        leg = None
        for target in _nearest(succ, walk[-1], wanted, free, key):
            path = _shortest(succ, pred, walk[-1], target, free, key)
            if _reaches(succ, target, start, free - set(path)):
                leg = path
                break
            wanted.discard(target)
        if leg is None:
            break
        walk += leg[1:]
        free -= set(leg)
        wanted -= set(leg)
    return walk + _shortest(succ, pred, walk[-1], start, free | {start}, key)[1:-1]


def _nearest(succ, source, wanted, allowed, key):
    """The nodes of ``wanted`` reachable from ``source`` through ``allowed``, nearest first,
    then by ``key`` (lazily: a breadth-first search by layers)."""
    seen, layer = {source}, [source]
    while layer:
        nxt = []
        for v in layer:
            for w in succ[v]:
                if w in allowed and w not in seen:
                    seen.add(w)
                    nxt.append(w)
        yield from sorted((w for w in nxt if w in wanted), key=key)
        layer = nxt


def _shortest(succ, pred, source, target, allowed, key) -> list:
    """The shortest path ``source`` -> ``target`` whose inner nodes are in ``allowed`` (a cycle
    when they are the same node), the first by ``key`` node by node; ``target`` must be
    reachable."""
    dist, layer, firsts = {target: 0}, [target], set(succ[source])
    while layer and firsts.isdisjoint(layer):     # backwards from target, up to source's successors
        nxt = []
        for v in layer:
            for u in pred[v]:
                if u not in dist and u in allowed:
                    dist[u] = dist[v] + 1
                    nxt.append(u)
        layer = nxt
    path, v = [source], source
    while True:
        v = min((w for w in succ[v] if w in dist and (w in allowed or w == target)),
                key=lambda w: (dist[w], key(w)))
        path.append(v)
        if v == target:
            return path


def _reaches(succ, source, target, allowed) -> bool:
    """Whether ``target`` is reachable from ``source`` through ``allowed``."""
    seen, work = {source}, [source]
    while work:
        for w in succ[work.pop()]:
            if w == target:
                return True
            if w in allowed and w not in seen:
                seen.add(w)
                work.append(w)
    return False


def _cores(counts, types=TYPES) -> str:
    return " + ".join(f"{counts[k]} {TYPE_NAMES[k]}" for k in types if counts[k])


def _hold_and_wait(t: Task) -> bool:
    return t.resident and t.collective is None
