"""A naive, exhaustive deadlock oracle: plain DFS over every interleaving of every step,
with no state hashing and no reduction, written straight from the model in
``pytest_npugraph.analysis.deadlock``'s docstring and sharing no code with it.

Why: the real search prunes (safe steps, device clusters, a visited set); this one tries
every order, so where the two disagree, the pruning lost (or invented) a deadlock.
Exponential: only for the small scenarios hypothesis generates.
"""
from __future__ import annotations

from pytest_npugraph.trace import DeviceCores, EventRecord, EventWait, HostSync, Kernel


class Oracle:
    def __init__(self, trace) -> None:
        self.pools, self.groups, self.members = {}, {}, {}
        self.queues: dict = {}          # sid -> [item]; item = (host index, record)
        self.device = {sid: info.device for sid, info in trace.streams.items()}
        self.where: dict = {}           # host index -> (sid, position)
        self.before: dict = {}          # host index -> host indices that must complete first
        latest, syncs = {}, []
        for index, rec in enumerate(trace.records):
            if isinstance(rec, DeviceCores):
                self.pools[rec.device] = (rec.cube, rec.vector)
            elif isinstance(rec, HostSync):   # what the host waited for before issuing anything later
                if rec.what in ("stream", "read") and rec.stream is not None:
                    syncs.append((index, rec.device, {rec.stream}))
                elif rec.what == "event":           # its latest record (never recorded: nothing)
                    syncs.append((index, rec.device, latest.get(rec.event, set())))
                else:
                    syncs.append((index, rec.device, None))
            elif isinstance(rec, (Kernel, EventRecord, EventWait)):
                if isinstance(rec, EventWait) and rec.event not in latest:
                    continue  # waiting for a never-recorded event does nothing
                queue = self.queues.setdefault(rec.stream, [])
                self.where[index] = (rec.stream, len(queue))
                queue.append((index, rec))
                first = {latest[rec.event]} if isinstance(rec, EventWait) else set()
                for sync_index, device, waited in syncs:  # host syncs of this device issued before it
                    if device != self.device[rec.stream]:
                        continue
                    if isinstance(waited, int):          # an event sync: its latest record
                        first.add(waited)
                    elif waited is None or isinstance(waited, set):   # the device, or one stream
                        first |= {i for i, (sid, _) in self.where.items()
                                  if i < sync_index and self.device[sid] == device
                                  and (waited is None or sid in waited)}
                self.before[index] = first
                if isinstance(rec, EventRecord):
                    latest[rec.event] = index
                if isinstance(rec, Kernel) and rec.collective:
                    self.groups.setdefault(rec.collective[0], set()).add(self.device[rec.stream])
                    self.members.setdefault(rec.collective, []).append(index)
        self.sids = sorted(self.queues)

    def blocks(self, rec) -> tuple:
        pool = self.pools.get(self.device[rec.stream], (24, 48))
        out = []
        for demand, limit, size in zip((rec.cores.cube, rec.cores.vector),
                                       (rec.cube_limit, rec.vector_limit), pool):
            if rec.cores.limit_applies and limit > 0:
                demand = min(demand, limit)
            out.append(max(0, min(demand, size)))
        return tuple(out)

    # a state: {sid: (position, cube held, vector held, arrived)}
    def complete(self, state, index) -> bool:
        sid, position = self.where[index]
        return state[sid][0] > position

    def head(self, state, sid):
        position = state[sid][0]
        queue = self.queues[sid]
        return queue[position] if position < len(queue) else None

    def free(self, state, device) -> list:
        free = list(self.pools.get(device, (24, 48)))
        for sid in self.sids:
            if self.device[sid] == device:
                free[0] -= state[sid][1]
                free[1] -= state[sid][2]
        return free

    def successors(self, state):
        for sid in self.sids:
            item = self.head(state, sid)
            if item is None or not all(self.complete(state, i) for i in self.before[item[0]]):
                continue
            position, cube, vector, arrived = state[sid]
            rec = item[1]
            moved = None
            if not isinstance(rec, Kernel):
                moved = (position + 1, 0, 0, False)
            elif not arrived:
                need = self.blocks(rec)
                free = self.free(state, self.device[sid])
                if rec.cores.all_resident and need != (0, 0):
                    got = (cube + min(free[0], need[0] - cube), vector + min(free[1], need[1] - vector))
                    if got == (cube, vector):
                        continue  # no core to take
                    if got != need:
                        moved = (position, got[0], got[1], False)
                    else:
                        cube, vector = got
                elif any(n and f < 1 for n, f in zip(need, free)):
                    continue
                if moved is None:
                    moved = ((position, cube, vector, True) if rec.collective
                             else (position + 1, 0, 0, False))
            if moved is not None:
                yield {**state, sid: moved}
        yield from self.collective_completions(state)

    def collective_completions(self, state):
        heads = {}
        for sid in self.sids:
            item = self.head(state, sid)
            if item is not None and isinstance(item[1], Kernel) and item[1].collective:
                heads.setdefault(item[1].collective, []).append(sid)
        for key, sids in heads.items():
            members = self.members[key]
            devices = {self.device[self.where[i][0]] for i in members}
            if (devices >= self.groups[key[0]] and len(sids) == len(members)
                    and all(state[sid][3] for sid in sids)):
                yield {**state, **{sid: (state[sid][0] + 1, 0, 0, False) for sid in sids}}

    def deadlock_reachable(self) -> bool:
        return self._dfs({sid: (0, 0, 0, False) for sid in self.sids})

    def _dfs(self, state) -> bool:
        moved = False
        for nxt in self.successors(state):
            moved = True
            if self._dfs(nxt):
                return True
        return not moved and any(self.head(state, sid) for sid in self.sids)

    def stuck(self, state) -> bool:
        """``state`` (as above) has work left and no successor."""
        return any(self.head(state, sid) for sid in self.sids) and next(self.successors(state), None) is None
