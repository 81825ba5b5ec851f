"""Core limits: values out of range, ops that may run at once needing more cores than the
device has, and limits that do not take effect (docs/reference.md, "Hazards":
``core-limit``, ``limit-ineffective``).

Why: limiting cores is the documented cure for the multi-stream core-occupation hang
(seed 000), and it only works if "the cores used by the operators that can block each
other together do not exceed the device's physical cores" (limit_cores docs, torchair
§7.6).  TorchAir's deadlock_check.py applies that rule to pairs of AIV collectives in a
hardware trace; here it is applied to every set of mutually concurrent ops (k-way: three
ops of 20 on a 48-core pool are caught), on both pools, with the limits taken into account.

Records the runtime emits for this module
-----------------------------------------
* ``DeviceCores(seq, device, cube, vector)``: once per device at
  the start of the trace (see taskgraph.py; 24/48 is assumed without it).
* ``StreamLimit(seq, stream, cube, vector, site)``: each
  ``set_stream_limit(stream, cube_num, vector_num)`` call, and each limit a
  ``limit_core_num(aicore, vector)`` scope puts on a stream; -1 = unchanged, as torch_npu.
* ``DeviceLimit(seq, device, cube, vector, site)``: each
  ``set_device_limit(device, cube_num, vector_num)``; -1 = unchanged.
* ``Kernel.cube_limit`` / ``vector_limit``: the limit in force on the issuing stream (its own,
  else the device's), 0 when the user set none; ``Kernel.cores`` its profile.

Rules
-----
* ``core-limit``, range: every value set must be in ``[1, max]`` of its pool (0 only on a
  pool the chip does not have).
* ``core-limit``, oversubscription: on one device and pool, a set of ops that may be in
  flight at once (no event, stream wait, sync or collective orders them; taskgraph.py)
  whose blocks sum above the pool.  Counted: resident ops (``all_resident``: they hold
  their cores until all blocks are in, so they can block each other: an error), and ops
  whose stream limit applies (the docs' rule for limited streams: a warning when only it
  is broken, since ops that are not resident can still share cores in waves).
* A limit counts where the user set one: ``0 < limit <= pool``.  A limit set to the device
  maximum restricts no single op, but the docs' rule is about the limits the user set: two
  streams limited to 24 + 12 cube cores on a 24-core device break it.  TorchAir's restore to
  the maximum after a ``limit_core_num`` scope is no limit (the runtime records none).
* ``limit-ineffective``: a limit in force on an op it does not bind (AICPU, ATB, static
  kernels: ``OpCores.limit_applies`` False).  An error when the op still takes AI cores and
  is resident or may overlap other core users on its device (the limit was meant to keep
  them apart and will not), otherwise a warning.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from ..hazard import Hazard
from ..trace import DeviceLimit, StreamLimit, Trace
from . import contents, taskgraph
from .taskgraph import TYPE_NAMES, TYPES, RangeMax, Task, TaskGraph

ARGS = ("cube_num", "vector_num")
LIMIT_RULE = ("the ops that can block each other must together use no more cores than the "
              "device physically has")


def find(trace: Trace, cache: Optional[dict] = None) -> list:
    """``core-limit`` and ``limit-ineffective`` hazards of ``trace``."""
    if contents.of(trace, cache).no_core_hazards:
        return []       # no limit set, and no two streams of a device with a resident op (contents.py)
    graph = taskgraph.of(trace, cache)
    return out_of_range(graph) + oversubscribed(graph) + ineffective(graph)


# ---------------------------------------------------------------------------- range
def _valid(value: int, size: int) -> bool:
    return 1 <= value <= size or value == size == 0


def out_of_range(graph: TaskGraph) -> list:
    """Limits set outside ``[1, max]``: by the markers of the setting calls, then by the
    limits kernels ran under that no marker explains; device by device (ranks' threads
    interleave their records differently on every run)."""
    trace, by_device, seen = graph.trace, defaultdict(list), set()
    for rec in trace.records:
        if isinstance(rec, StreamLimit):
            info, target = trace.streams.get(rec.stream), taskgraph.stream_name(trace, rec.stream)
            device, values, streams = (info.device if info else 0), (rec.cube, rec.vector), [target]
            call = f"set_stream_limit({target}, {{}})"
        elif isinstance(rec, DeviceLimit):
            device, values, streams = rec.device, (rec.cube, rec.vector), []
            call = f"set_device_limit({device}, {{}})"
        else:
            continue
        pool = graph.pools.get(device, taskgraph.DEFAULT_POOL)
        for k in TYPES:
            value = values[k]
            if value != -1 and not _valid(value, pool[k]):
                seen.add((device, k, value))
                by_device[device].append(_range_hazard(call.format(f"{ARGS[k]}={value}"), k, value,
                                                       pool, device, rec, streams))
    hazards = [h for device in sorted(by_device) for h in by_device[device]]
    reported = set()
    for t in (graph.tasks[tid] for tids in graph.lanes for tid in tids):
        rec = t.kernel
        if rec is None:
            continue
        device, pool = graph.device(t), graph.pool(t)
        for k, value in zip(TYPES, (rec.cube_limit, rec.vector_limit)):
            key = (device, k, value)
            if value and not _valid(value, pool[k]) and key not in seen and (t.lane, key) not in reported:
                reported.add((t.lane, key))
                hazards.append(_range_hazard(
                    f"the {TYPE_NAMES[k]} limit {value} in force when {rec.op} was issued",
                    k, value, pool, device, rec, [graph.stream_label(t.lane)]))
    return hazards


def _range_hazard(what: str, k: int, value: int, pool: tuple, device: int, rec, streams) -> Hazard:
    kind, size = TYPE_NAMES[k], pool[k]
    allowed = f"[1, {size}]" if size else "0 (the chip has none)"
    return Hazard(
        "core-limit",
        f"{what}: a {kind} core limit must be in {allowed} on npu:{device}, which has {size} "
        f"{kind} cores (set_stream_limit and limit_core_num take [1, max_{kind}]); {value} "
        + ("exceeds the device" if value > size else "leaves no core to run on" if value == 0
           else "is not a core count (-1 alone means unchanged)"),
        where=[str(rec.site)], streams=list(streams), seqs=(rec.seq,))


# ------------------------------------------------------------------ oversubscription
def _limits(graph: TaskGraph, t: Task, restricting: bool = False) -> tuple:
    """The limits in force on ``t`` per pool that the user set (0 < limit <= pool; 0: none), or with
    ``restricting`` only those below the pool (a limit at the maximum keeps no kernel from a core)."""
    pool = graph.pool(t)
    top = 0 if restricting else 1
    return tuple(v if 0 < v < pool[k] + top else 0
                 for k, v in zip(TYPES, (t.rec.cube_limit, t.rec.vector_limit)))


def _counted(graph: TaskGraph, t: Task, k: int, resident_only: bool) -> int:
    """Cores of pool ``k`` that op ``t`` occupies for the rule (0: it does not count)."""
    if t.resident:
        return t.need[k]
    if resident_only or t.kernel is None or not t.rec.cores.limit_applies:
        return 0
    return t.need[k] if _limits(graph, t)[k] else 0


def oversubscribed(graph: TaskGraph) -> list:
    """Per device and pool: sets of resident ops above the pool (errors), then sets that
    also count limited streams' ops (warnings).  One report per cause: the sets of one pool
    and severity on the same streams (by name within their device) are one hazard, listing
    the other ops and devices (MoE dispatch and combine on one stream, every rank of a
    ``run_ranks`` test)."""
    groups: dict = {}
    for device, lanes in graph.device_lanes.items():
        if len(lanes) < 2:
            continue
        for k in TYPES:
            reported: set = set()
            for resident_only in (True, False):
                for clique in _cliques(graph, lanes, k, resident_only):
                    key = frozenset((t.lane, str(t.rec.site), t.rec.op) for t in clique)
                    if key in reported:
                        continue
                    resident_sum = sum(t.need[k] for t in clique if t.resident)
                    if not resident_only and resident_sum > graph.pools[device][k]:
                        continue  # the resident ops alone break the pool: reported as an error
                    reported.add(key)
                    cause = (k, resident_only, frozenset(_local(graph.stream_label(t.lane)) for t in clique))
                    groups.setdefault(cause, []).append((device, clique))
    return [_clique_hazard(graph, k, members, resident_only) for (k, resident_only, _), members in groups.items()]


def _local(label: str) -> str:
    """A stream's name within its device: ``stream-1`` of ``npu:0/stream-1``."""
    return label.partition("/")[2] or label


def _cliques(graph: TaskGraph, lanes: list, k: int, resident_only: bool):
    """Sets of mutually concurrent ops (one per stream) whose counted cores exceed the pool:
    for each op, the heaviest such set containing it (branch and bound over the other
    streams' windows, which are intervals), skipping ops already in a reported set."""
    weight = {t.tid: _counted(graph, t, k, resident_only) for t in graph.tasks}
    peak = {lane: RangeMax([weight[tid] for tid in graph.lanes[lane]]) for lane in lanes}
    covered: set = set()
    for lane in lanes:
        for tid in graph.lanes[lane]:
            anchor = graph.tasks[tid]
            if not weight[tid] or tid in covered:
                continue
            size = graph.pool(anchor)[k]
            windows = list(graph.overlapping(anchor))
            if weight[tid] + sum(peak[ln](lo, hi) for ln, lo, hi in windows) <= size:
                continue
            best: list = [size, None]   # only sets above the pool are of interest

            def extend(i: int, chosen: list, total: int) -> None:
                if i == len(windows):
                    if total > best[0]:
                        best[:] = [total, list(chosen)]
                    return
                if total + sum(peak[ln](lo, hi) for ln, lo, hi in windows[i:]) <= best[0]:
                    return
                ln, lo, hi = windows[i]
                options = [graph.tasks[u] for u in graph.lanes[ln][lo:hi] if weight[u]]
                for u in sorted(options, key=lambda u: -weight[u.tid]):
                    if all(graph.concurrent(u.tid, c.tid) for c in chosen):
                        extend(i + 1, chosen + [u], total + weight[u.tid])
                extend(i + 1, chosen, total)

            extend(0, [anchor], weight[tid])
            if best[1] is not None:
                covered.update(t.tid for t in best[1])
                yield sorted(best[1], key=lambda t: t.tid)


def _clique_hazard(graph: TaskGraph, k: int, members: list, resident_only: bool) -> Hazard:
    """One report for the sets of ``members`` ((device, clique) pairs with one cause): the first
    set in full, then the other ops and devices where the same streams break the pool."""
    kind = TYPE_NAMES[k]
    device, clique = members[0]
    size = graph.pools[device][k]
    total = sum(t.need[k] for t in clique)

    def part(t: Task) -> str:
        limit = _limits(graph, t)[k]
        how = ["resident: all blocks at once" if t.resident else "not resident"]
        if limit and t.rec.cores.limit_applies:
            how.append(f"stream limit {limit}")
        return f"{graph.describe(t)}: {t.need[k]} ({', '.join(how)})"

    shown = {(t.rec.op, str(t.rec.site)) for t in clique}
    others = []
    for _, other in members[1:]:
        for t in other:
            if (t.rec.op, str(t.rec.site)) not in shown:
                shown.add((t.rec.op, str(t.rec.site)))
                others.append(f"{t.rec.op} ({t.rec.site}): {t.need[k]}")
    devices = sorted({d for d, _ in members})
    also = ""
    if others:
        also += "; also with " + ", ".join(others) + " in its stream's place"
    if len(devices) > 1:
        also += "; the same on " + ", ".join(f"npu:{d}" for d in devices if d != device)
    summary = (f"{len(clique)} ops on " + ", ".join(f"npu:{d}" for d in devices)
               + f" may run at the same time and need {total} {kind} cores together, but the device has {size} ("
               + ", ".join(f"{t.rec.op} {t.need[k]}" for t in clique) + ")")
    head = (f"{len(clique)} ops on npu:{device} may run at the same time and need {total} "
            f"{kind} cores together, but the device has {size}: "
            + "; ".join(part(t) for t in clique) + also + ". Nothing orders them (no event, stream "
            "wait, synchronisation or collective), so their blocks can be dispatched together")
    if resident_only:
        tail = (". Ops that hold their cores until all their blocks are resident (NonZero-like "
                "full-core sync, AIV-mode collectives, MC2) can then each keep part of the pool "
                f"and wait for the rest forever. Fix: {LIMIT_RULE}: limit them "
                f"(torch.npu.set_stream_limit / torchair.scope.limit_core_num) so they sum to "
                f"at most {size}, or order them with an event.")
    else:
        tail = (f". With core limits on several streams, the docs require that streams running "
                f"at once together use no more than the device's cores ({LIMIT_RULE}). Fix: "
                f"lower the limits so they sum to at most {size}, or order the streams with an "
                f"event.")
    every = [t for _, c in members for t in c]
    return Hazard(
        "core-limit", head + tail,
        where=_unique(str(t.rec.site) for t in every),
        streams=_unique(graph.stream_label(t.lane) for t in every),
        ops=_unique(t.rec.op for t in every), seqs=tuple(t.rec.seq for t in every),
        severity="error" if resident_only else "warning", summary=summary)


def _unique(items) -> list:
    return list(dict.fromkeys(items))


# ----------------------------------------------------------------------- ineffective
WHY_IGNORED = {
    "AICPU": "AICPU ops run on the AI CPU and do not take core limits",
    "ATB": "ATB ops do not take core limits",
    "HCCL": ("HCCL collectives in AI_CPU or HOST expansion mode (HCCL_OP_EXPANSION_MODE) are orchestrated on "
             "the AI CPU or the host and do not take core limits; only AIV mode runs them on the vector cores a "
             "limit governs"),
}


def ineffective(graph: TaskGraph) -> list:
    """One hazard per (op, call site, stream) run under a limit it ignores."""
    groups = defaultdict(list)
    for t in graph.tasks:
        rec = t.kernel
        if rec is not None and not rec.cores.limit_applies and any(_limits(graph, t, restricting=True)):
            groups[rec.op, str(rec.site), t.lane].append(t)
    hazards = []
    for _, group in sorted(groups.items(), key=lambda item: (item[0][2], item[1][0].pos)):   # by lane
        t = group[0]
        overlaps = [u for ln, lo, hi in graph.overlapping(t)
                    for u in (graph.tasks[tid] for tid in graph.lanes[ln][lo:hi])
                    if any(u.need[k] and t.need[k] for k in TYPES)]
        hazards.append(_ineffective_hazard(graph, group, overlaps))
    return hazards


def _ineffective_hazard(graph: TaskGraph, group: list, overlaps: list) -> Hazard:
    t, count = group[0], len(group)
    rec = t.rec
    why = WHY_IGNORED.get(rec.cores.kind, f"this {rec.cores.kind} op runs as a static kernel "
                          "(compiled without tiling, so the core count cannot reach it)")
    times = f" ({count} launches)" if count > 1 else ""
    limits = " and ".join(f"{TYPE_NAMES[k]} {v}" for k, v in zip(TYPES, _limits(graph, t, restricting=True)) if v)
    text = f"{graph.describe(t)}{times} runs under a core limit ({limits}) that does not take effect: {why}."
    uses = " + ".join(f"{t.need[k]} {TYPE_NAMES[k]}" for k in TYPES if t.need[k])
    serious = bool(uses) and (t.resident or bool(overlaps))
    if uses:
        text += f" It still takes {uses} cores"
        if t.resident:
            text += (", all at once (it holds them until all its blocks are resident), so the "
                     "limit will not stop it from starving or deadlocking the ops beside it")
        if overlaps:
            text += (", and it may run at the same time as "
                     + ", ".join(graph.describe(u) for u in overlaps[:3])
                     + ("..." if len(overlaps) > 3 else "")
                     + ": the limit does not keep their cores apart")
        text += "."
    else:
        text += " It takes no AI cores, so the limit is only misleading here."
    if serious:
        text += (" Fix: order it with events against the ops the limit was meant to protect, "
                 "or use an Ascend C (AI Core / AIV) implementation that honours the limit.")
    return Hazard(
        "limit-ineffective", text, where=[str(rec.site)],
        streams=[graph.stream_label(t.lane)], ops=[rec.op],
        seqs=tuple(u.rec.seq for u in group), severity="error" if serious else "warning")
