"""Oracle for asynchronous collectives: random multi-rank programs against an exhaustive search.

Why: the runtime decides at run time whether the ranks hang (every rank blocked or finished with
device work that can never run), the deadlock analysis decides from the trace whether some
schedule hangs (cores included).  Hypothesis generates 2-3 ranks, 2-3 communicators with their
own HCCL expansion mode (AIV: every vector core, held until the peers arrive; HOST: none), a
random issue order per rank, random streams and host reads; every run is checked against the
naive DFS oracle of tests/analysis_cores (every interleaving of every step, no reductions):

* the analysis reports a deadlock exactly when the oracle finds one reachable;
* a run the runtime ended with ``DeviceHang`` is one the oracle finds stuck;
* without AIV (no cores), the runtime hangs exactly when the oracle finds a deadlock (the
  device is then deterministic), and a run that completes computes the right sums.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_npu
from analysis_cores.oracle import Oracle
from pytest_npugraph._context import CONTEXT
from pytest_npugraph.analysis import deadlock
from pytest_npugraph.runtime import collectives
from pytest_npugraph.runtime.executor import DeviceHang
from pytest_npugraph.runtime.runtime import current
from pytest_npugraph.trace import GroupCreated

pytestmark = [pytest.mark.npu_devices(3),
              pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning")]


class ExhaustiveOracle(Oracle):
    """The naive oracle's transition system, every interleaving, with a visited set (a run's trace
    has dozens of tasks: plain DFS without one is exponential).  A communicator's members are the
    devices of its ``GroupCreated`` record (a member that never issued a collective still counts)."""

    def __init__(self, trace) -> None:
        super().__init__(trace)
        for rec in trace.records:
            if isinstance(rec, GroupCreated) and rec.group in self.groups:
                self.groups[rec.group] = set(rec.devices)

    def deadlock_reachable(self) -> bool:
        stack, seen = [{sid: (0, 0, 0, False) for sid in self.sids}], set()
        while stack:
            state = stack.pop()
            key = tuple(sorted(state.items()))
            if key in seen:
                continue
            seen.add(key)
            successors = list(self.successors(state))
            if not successors and any(self.head(state, sid) for sid in self.sids):
                return True
            stack.extend(successors)
        return False


EXAMPLES = int(__import__("os").environ.get("NPUGRAPH_ORACLE_EXAMPLES", "40"))


@st.composite
def programs(draw):
    ranks = draw(st.integers(2, 3))
    comms = draw(st.integers(2, 3))
    modes = [draw(st.sampled_from((1, 3))) for _ in range(comms)]          # HOST or AIV
    per_comm = [draw(st.integers(1, 2)) for _ in range(comms)]
    plans = []
    for _ in range(ranks):
        calls = [c for c in range(comms) for _ in range(per_comm[c])]
        order = draw(st.permutations(calls))                                # this rank's issue order
        streams = [draw(st.integers(0, 1)) for _ in range(comms)]           # stream of each comm
        reads = [draw(st.integers(0, 5)) == 0 for _ in order]               # a host read after it
        plans.append((order, streams, reads))
    return ranks, comms, modes, plans


def rank_fn(rank, comms, modes, plans):
    groups = []
    for mode in modes:
        options = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
        options.hccl_config = {"hccl_op_expansion_mode": mode}
        groups.append(dist.new_group(list(range(dist.get_world_size())), pg_options=options))
    order, stream_of, reads = plans[rank]
    main = torch.npu.current_stream()
    streams = [main, torch.npu.Stream()]
    results = []
    for comm, read in zip(order, reads):
        t = torch.full((2,), float(rank + 1), device="npu")
        stream = streams[stream_of[comm]]
        stream.wait_stream(main)
        with torch.npu.stream(stream):
            dist.all_reduce(t, group=groups[comm])
        results.append(t)
        if read:
            with torch.npu.stream(stream):
                t.cpu()
    main.wait_stream(streams[1])
    return [t.cpu().tolist() for t in results]


def test_async_collectives_agree_with_the_exhaustive_oracle(npugraph):
    base = CONTEXT.config
    verdicts: Counter = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(programs())
    def agree(program):
        ranks, comms, modes, plans = program
        CONTEXT.begin(dataclasses.replace(base, device_count=ranks), CONTEXT.test_hook)
        rt = current()
        from torch_npu.distributed import _ranks

        hung = False
        try:
            results = collectives.run_ranks(rt, rank_fn, (comms, modes, plans), context=_ranks.CONTEXT)
        except DeviceHang:
            hung = True
        expected = ExhaustiveOracle(rt.trace).deadlock_reachable()
        found = deadlock.explore(rt.trace)
        assert found.complete
        assert (found.stuck is not None) == expected, program
        if hung:
            assert expected, program                                         # a real hang is reachable
        if all(m == 1 for m in modes):
            assert hung == expected, program                                 # no cores: deterministic
        if not hung:
            total = float(ranks * (ranks + 1) // 2)
            assert all(r == [total, total] for rs in results for r in rs), program
        verdicts["hang" if hung else "ran"] += 1
        verdicts["deadlock" if expected else "free"] += 1

    try:
        agree()
    finally:
        CONTEXT.begin(base, CONTEXT.test_hook)                              # the test's own, clean runtime
    assert min(verdicts["hang"], verdicts["ran"], verdicts["free"]) >= EXAMPLES // 10, verdicts
    assert verdicts["deadlock"] > verdicts["hang"], verdicts                 # AIV cores add hangs no run shows
