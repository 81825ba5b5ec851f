"""The reduced deadlock search agrees with the naive exhaustive oracle on random scenarios.

Why: the search skips interleavings (safe steps, device clusters, visited states); a wrong
independence argument would silently hide deadlocks, so hypothesis hunts for a scenario
where the two verdicts differ.  Pools are tiny so that contention, and deadlocks, are common.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_npugraph.analysis import deadlock, taskgraph

from .build import Builder
from .oracle import Oracle

MAX_TASKS = 7
EXAMPLES = 600


@st.composite
def scenarios(draw, max_tasks: int = MAX_TASKS):
    """2-3 devices, 1-4 streams each, up to ``max_tasks`` stream tasks: ops with cube/vector
    demands (resident or not, limits that apply or not), collectives over all or some
    devices issued in per-device orders, event record/wait pairs, limits, host syncs."""
    devices = draw(st.integers(2, 3))
    b = Builder(devices=0)
    for device in range(devices):
        b.marker("device", detail=(device, draw(st.integers(0, 3)), draw(st.integers(1, 6))))
    streams = [[b.stream(device) for _ in range(draw(st.integers(1, 4)))]
               for device in range(devices)]
    programs: list = [[] for _ in range(devices)]   # per device: calls, in its issue order
    seqs: Counter = Counter()

    def stream_of(device):
        return draw(st.sampled_from(streams[device]))

    def cores():
        return dict(cube=draw(st.integers(0, 3)), vector=draw(st.integers(0, 6)),
                    resident=draw(st.booleans()), limit_applies=draw(st.booleans()))

    def collective(device, sid, group, op, profile):
        def issue():
            seqs[group, device] += 1
            b.collective(sid, op, group, seqs[group, device], **profile)
        return issue

    budget = max_tasks
    while budget > 0:
        what = draw(st.sampled_from(["kernel", "collective", "collective", "event", "limit", "sync"]))
        device = draw(st.integers(0, devices - 1))
        program = programs[device]
        at = draw(st.integers(0, len(program)))  # calls land anywhere in the device's order
        if what == "kernel":
            sid, profile = stream_of(device), cores()
            program.insert(at, lambda sid=sid, p=profile: b.kernel(sid, "op", **p))
            budget -= 1
        elif what == "collective":
            group, op, profile = draw(st.sampled_from(["tp", "ep"])), draw(st.sampled_from(["ar", "ag"])), cores()
            members = draw(st.sets(st.integers(0, devices - 1), min_size=1)) if draw(
                st.integers(0, 9)) == 0 else set(range(devices))
            if len(members) > budget:
                continue
            for member in sorted(members):
                slot = draw(st.integers(0, len(programs[member])))
                programs[member].insert(slot, collective(member, stream_of(member), group, op, profile))
            budget -= len(members)
        elif what == "event" and budget >= 2:
            first, then, eid = stream_of(device), stream_of(device), b.event()
            program.insert(at, lambda: (b.record(first, eid), b.wait(then, eid)))
            budget -= 2
        elif what == "limit":
            sid, c, v = stream_of(device), draw(st.integers(-1, 3)), draw(st.integers(-1, 6))
            program.insert(at, lambda: b.limit(sid, c, v))
        elif what == "sync":
            program.insert(at, lambda: b.sync(device))
            budget -= 1
    while any(programs):  # host order: the devices' calls interleaved
        device = draw(st.sampled_from([d for d, p in enumerate(programs) if p]))
        programs[device].pop(0)()
    return b.trace


def test_search_agrees_with_exhaustive_oracle():
    verdicts: Counter = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(scenarios())
    def agree(trace):
        result = deadlock.explore(trace)
        oracle = Oracle(trace)
        expected = oracle.deadlock_reachable()
        assert result.complete
        assert (result.stuck is not None) == expected, _show(trace)
        if result.stuck is not None:  # the reported state really is stuck
            assert oracle.stuck(_as_oracle_state(trace, *result.stuck)), _show(trace)
        verdicts[expected] += 1

    agree()
    # the generator must exercise both verdicts, or agreement says little
    assert verdicts[True] >= EXAMPLES // 10 and verdicts[False] >= EXAMPLES // 10, verdicts


class Unreduced(deadlock.Search):
    """The same transition system searched without the reductions (every step branches;
    only the visited set remains): exact, and fast enough for larger scenarios."""

    safe = defaultdict(bool)

    def persistent(self, pos, steps):
        return steps


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(max_tasks=16))
def test_reductions_keep_the_verdict_on_larger_scenarios(trace):
    graph = taskgraph.build(trace)
    reduced, full = deadlock.Search(graph).run(), Unreduced(graph).run(budget=10**6)
    assert reduced.complete and full.complete
    assert (reduced.stuck is None) == (full.stuck is None), _show(trace)
    assert reduced.states <= full.states


def _as_oracle_state(trace, pos, held) -> dict:
    graph = taskgraph.build(trace)
    return {graph.sids[lane]: (pos[lane], *held[lane]) for lane in range(len(graph.lanes))}


def _show(trace) -> str:
    return "\n".join(map(repr, trace.records))
