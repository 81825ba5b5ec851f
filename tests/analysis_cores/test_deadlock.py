"""deadlock: core occupation across cards, collective order, missing peers; silent on fixes."""
from __future__ import annotations

import logging

from pytest_npugraph.analysis import deadlock, taskgraph

from analysis.tracebuild import Build

from .scenarios import seed


def deadlocks(trace):
    return [h for h in deadlock.find(trace) if h.kind == "deadlock"]


def test_seed_deadlock_names_the_cycle_the_sites_and_the_fix():
    (hazard,) = deadlocks(seed().trace)
    text = hazard.message
    # the two cards play mirrored roles; which card got which is the search's choice
    for part in ("reduce_scatter on npu:0/hccl (model.py:3)", "nonzero on npu:1/compute (model.py:8)",
                 "holds 32 vector", "holds 24 vector", "arrived holding 16 vector; waits for its "
                 "peers: reduce_scatter on npu:", "arrived holding 24 vector; waits for its peers: "
                 "dispatch_combine on npu:", "cycle: ",
                 "limit nonzero on npu:0/compute (model.py:5) to 8 vector cores "
                 "(48 - 16 reduce_scatter - 24 dispatch_combine)",
                 "limit nonzero on npu:1/compute (model.py:8) to 8 vector cores"):
        assert part in text, text
    assert sorted(hazard.where) == [f"model.py:{line}" for line in range(3, 9)]
    assert set(hazard.ops) == {"reduce_scatter", "dispatch_combine", "nonzero"}
    assert len(hazard.streams) == 6


def test_seed_fix_is_clean_and_one_core_more_still_cannot_deadlock():
    assert deadlock.find(seed(nonzero_limit=8).trace) == []
    # 9 cores: NonZero can hold at most 8 while waiting, never the 16 reduce-scatter needs;
    # the static k-way rule (cores.py) still reports 49 > 48
    assert deadlock.find(seed(nonzero_limit=9).trace) == []
    assert deadlocks(seed(nonzero_limit=40).trace)


def test_nonzero_ordered_after_the_collectives_is_clean():
    b = Build(devices=2)
    for device in range(2):
        rs, ep, nz = (b.stream(device=device) for _ in range(3))
        b.collective(rs, "reduce_scatter", "tp", 0, vector=16)
        b.collective(ep, "dispatch_combine", "ep", 0, vector=24)
        b.wait_stream(nz, rs)
        b.wait_stream(nz, ep)
        b.kernel(nz, op="nonzero", vector=48, resident=True)
    assert deadlock.find(b.trace) == []


def rank_programs(orders, streams_per_rank=1, **cores) -> Build:
    """Rank r issues the collectives ``orders[r]`` (op, group) in order, round-robin over its
    streams; each group numbers its collectives per rank, as the runtime does."""
    b = Build(devices=len(orders))
    for rank, order in enumerate(orders):
        streams = [b.stream(f"s{i}", rank) for i in range(streams_per_rank)]
        counts: dict = {}
        for i, (op, group) in enumerate(order):
            counts[group] = counts.get(group, 0) + 1
            b.collective(streams[i % streams_per_rank], op, group, counts[group], **cores)
    return b


def test_mismatched_collective_order_within_a_group():
    b = rank_programs([[("all_reduce", "g"), ("all_gather", "g")],
                       [("all_gather", "g"), ("all_reduce", "g")]])
    (hazard,) = deadlocks(b.trace)
    assert "collective #1 of group 'g' is not the same op on every rank" in hazard.message
    assert "all_reduce on npu:0/s0" in hazard.message and "all_gather on npu:1/s0" in hazard.message
    first = [r for r in b.trace.records if getattr(r, "collective", None) == ("g", 1)]
    assert deadlock.collective_mismatch(b.trace, first) is not None
    same = rank_programs([[("all_reduce", "g")], [("all_reduce", "g")]])
    assert deadlock.collective_mismatch(same.trace, same.trace.records[-2:]) is None


def test_groups_in_different_orders_on_one_stream_wait_on_each_other():
    b = rank_programs([[("all_reduce", "tp"), ("all_reduce", "dp")],
                       [("all_reduce", "dp"), ("all_reduce", "tp")]], resident=False)
    (hazard,) = deadlocks(b.trace)
    cycle = hazard.message.split("cycle: ")[1].split("\n")[0]
    assert cycle in ("all_reduce[tp#1]@npu:0/s0 -> all_reduce[tp#1]@npu:1/s0 -> all_reduce[dp#1]@npu:1/s0"
                     " -> all_reduce[dp#1]@npu:0/s0 -> all_reduce[tp#1]@npu:0/s0",
                     "all_reduce[dp#1]@npu:1/s0 -> all_reduce[dp#1]@npu:0/s0 -> all_reduce[tp#1]@npu:0/s0"
                     " -> all_reduce[tp#1]@npu:1/s0 -> all_reduce[dp#1]@npu:1/s0"), cycle
    assert "queued behind all_reduce on npu:1/s0 (model.py:5)" in hazard.message
    assert "same order on every rank" in hazard.message


def test_groups_in_different_orders_on_two_streams_deadlock_only_when_the_cores_do_not_fit():
    orders = [[("all_reduce", "tp"), ("all_to_all", "ep")], [("all_to_all", "ep"), ("all_reduce", "tp")]]
    assert deadlocks(rank_programs(orders, streams_per_rank=2, vector=32).trace)
    assert deadlock.find(rank_programs(orders, streams_per_rank=2, vector=24).trace) == []


def test_a_rank_that_never_issues_a_collective():
    b = rank_programs([[("all_reduce", "tp"), ("all_reduce", "tp")], [("all_reduce", "tp")]])
    (hazard,) = deadlocks(b.trace)
    assert "npu:1, which never issues it" in hazard.message


def starved(nonzero_after_tp: bool) -> Build:
    """npu:0: the tp collective (16 cores) and NonZero (48: it takes the other 32) can leave
    no core for the plain op in front of the ep collective, which npu:1 needs before tp."""
    b = Build(devices=2)
    tp, side, nz = (b.stream(name, 0) for name in ("tp", "side", "nz"))
    b.collective(tp, "all_reduce", "tp", 1, vector=16)
    b.kernel(side, op="add", vector=8)
    b.collective(side, "all_to_all", "ep", 1, vector=0, resident=False)
    if nonzero_after_tp:
        b.wait_stream(nz, tp)
    b.kernel(nz, op="nonzero", vector=48, resident=True)
    peer = b.stream("hccl", 1)
    b.collective(peer, "all_to_all", "ep", 1, vector=0, resident=False)
    b.collective(peer, "all_reduce", "tp", 1, vector=16)
    return b


def test_a_non_resident_op_starved_of_every_core_closes_the_cycle():
    (hazard,) = deadlocks(starved(nonzero_after_tp=False).trace)
    assert "add on npu:0/side (model.py:4): needs a free vector core" in hazard.message
    assert "limit nonzero on npu:0/nz (model.py:6) to 32 vector cores (48 - 16 all_reduce)" in hazard.message
    assert deadlock.find(starved(nonzero_after_tp=True).trace) == []


def test_host_sync_orders_only_its_own_device():
    """Rank 0 syncs after its all_reduce before rank 1 issued its half (``run_ranks``
    threads): a host-global barrier would invent a deadlock here."""
    b = Build(devices=2)
    s0, s1 = b.stream(device=0), b.stream(device=1)
    b.collective(s0, "all_reduce", "tp", 1, vector=16)
    b.sync(device=0)
    b.kernel(s0, op="add", vector=48)
    b.collective(s1, "all_reduce", "tp", 1, vector=16)
    assert deadlock.find(b.trace) == []


def test_budget_exhausted_reports_nothing_but_logs(caplog):
    trace = seed().trace
    result = deadlock.explore(trace, budget=3)
    assert not result.complete and result.stuck is None
    with caplog.at_level(logging.WARNING, logger="pytest_npugraph.analysis.deadlock"):
        assert deadlock.find(trace, budget=3) == []
    assert "stopped after 3 states" in caplog.text


def test_uncontended_pipeline_needs_no_branching():
    """Safe steps only: the reduction turns a whole clean run into one state."""
    b = Build(devices=2)
    for device in range(2):
        main, comm = b.stream(device=device), b.stream(device=device)
        for layer in range(20):
            b.kernel(main, op="matmul", cube=24, vector=48)
            b.wait_stream(comm, main)
            b.collective(comm, "all_reduce", "tp", layer, vector=16)
            b.kernel(main, op="nonzero", vector=32, resident=True)
    assert deadlock.explore(b.trace).states == 1
    assert deadlock.find(b.trace) == []


def test_spmd_ranks_are_interchangeable_unless_an_event_links_one_to_another():
    b = seed()
    assert len(deadlock.Search(taskgraph.build(b.trace)).orbits) == 1
    streams = list(b.trace.streams)
    b.wait_stream(streams[3], streams[0])  # npu:1's hccl stream waits for an event recorded on npu:0
    assert deadlock.Search(taskgraph.build(b.trace)).orbits == []


def test_spmd_report_summarises_queued_streams_and_gives_one_fix_per_call_site():
    b = Build(devices=3)
    for device in range(3):
        rs, ep, nz, compute = (b.stream(name, device) for name in ("hccl", "moe", "nz", "compute"))
        b.collective(rs, "reduce_scatter", "tp", 0, vector=16)
        b.collective(ep, "dispatch_combine", "ep", 0, vector=24)
        b.kernel(nz, op="nonzero", vector=48, resident=True, line=50)  # one line run by every rank
        b.wait_stream(compute, rs)
        b.kernel(compute, op="matmul", cube=24)
    (hazard,) = deadlocks(b.trace)
    assert "more streams blocked behind them: " in hazard.message
    assert "npu:0/compute" in hazard.message.split("blocked behind them: ")[1]
    assert "EventWait" not in hazard.message.split("blocked behind them")[0]
    fix = hazard.message.split("fix: ")[1]
    assert fix.count("limit nonzero on") == 1 and "(model.py:50) to 8 vector cores" in fix
    assert ", and the same on npu:" in fix


def ranks_in_opposite_orders(first: int, interleave) -> Build:
    """Seed 000 as ``run_ranks`` records it: card 0 issues reduce-scatter then dispatch, card 1
    the other way round.  ``first``: the card whose streams exist first (their ids come from a
    process-wide counter); ``interleave``: the cards, in the order their threads issue the
    next call (each call keeps its source line, whatever its position in the trace)."""
    b = Build(devices=2)
    streams = {}
    for device in (first, 1 - first):
        streams.update({(device, name): b.stream(name, device) for name in ("tp", "ep", "mask")})

    def calls(d):
        tp = lambda: b.collective(streams[d, "tp"], "reduce_scatter", "tp", 0, vector=16, line=51)
        ep = lambda: b.collective(streams[d, "ep"], "dispatch", "ep", 0, vector=24, kind="MC2", line=55)
        nz = lambda: b.kernel(streams[d, "mask"], op="nonzero", vector=48, resident=True, line=63)
        return [tp, ep, nz] if d == 0 else [ep, tp, nz]

    pending = {0: calls(0), 1: calls(1)}
    for device in interleave:
        pending[device].pop(0)()
    return b


def test_multi_rank_report_is_the_same_whatever_the_thread_interleaving():
    """The same program must give the same report text on every run: not the order of the
    stream ids, nor of the ranks' records in the trace."""
    reports = []
    for first, interleave in ((0, (0, 0, 0, 1, 1, 1)), (1, (1, 1, 1, 0, 0, 0)), (1, (1, 0, 0, 1, 0, 1))):
        (hazard,) = deadlocks(ranks_in_opposite_orders(first, interleave).trace)
        reports.append((hazard.message, hazard.where, hazard.streams, hazard.ops, hazard.key))
    assert reports[1] == reports[0] and reports[2] == reports[0]
    message = reports[0][0]
    assert message.split("cycle: ")[1].startswith("reduce_scatter[tp#0]@npu:0/tp -> "), message
    lines = [line for line in message.splitlines() if line.startswith("  - ")]
    assert [line.split(" (")[0] for line in lines] == [
        "  - reduce_scatter on npu:0/tp", "  - dispatch on npu:0/ep", "  - nonzero on npu:0/mask",
        "  - dispatch on npu:1/ep", "  - reduce_scatter on npu:1/tp", "  - nonzero on npu:1/mask"]


def test_mismatched_collective_names_the_ranks_in_device_order():
    b = rank_programs([[("all_reduce", "g")], [("all_gather", "g")]])
    members = [r for r in b.trace.records if getattr(r, "collective", None) == ("g", 1)]
    forward, backward = (deadlock.collective_mismatch(b.trace, m) for m in (members, members[::-1]))
    assert (backward.message, backward.where, backward.streams) == (forward.message, forward.where, forward.streams)
    assert forward.streams == ["npu:0/s0", "npu:1/s0"]


def every_rank_starts_its_own_group(ranks: int, first_rank_last: bool) -> Build:
    """Rank r issues an all_reduce on group ``g<r>`` (every rank is a member of every group)
    first, then those of the other groups in increasing order: every rank's head waits for a
    member queued behind every other rank's head, a wait-for graph with a cycle through every
    set of ranks (more than 500 from 8 ranks on).  ``first_rank_last``: the streams are created
    and the calls issued in reverse rank order, round-robin (the task ids, and so the order
    networkx meets nodes in, change; every call keeps its source line)."""
    b = Build(devices=ranks)
    order = list(range(ranks))[::-1] if first_rank_last else list(range(ranks))
    streams = {rank: b.stream("s", rank) for rank in order}
    programs = {rank: [rank] + [g for g in range(ranks) if g != rank] for rank in range(ranks)}
    calls = ([rank for _ in range(ranks) for rank in order] if first_rank_last
             else [rank for rank in order for _ in range(ranks)])
    for rank in calls:
        line = 10 + ranks - len(programs[rank])
        b.collective(streams[rank], "all_reduce", f"g{programs[rank].pop(0)}", 1, vector=0, resident=False,
                     line=line)
    return b


def cycle_of(message: str) -> str:
    return message.split("cycle: ")[1].split("\n")[0]


def test_the_reported_cycle_is_the_same_whatever_the_task_ids_with_more_than_500_cycles():
    """The cycle shown used to be the best of the first 500 that networkx enumerated, an order
    that follows the task ids: with more cycles than that, two runs of one program could
    name different cycles (here a 3-rank one for one order of the ids)."""
    from itertools import islice

    import networkx as nx

    reports = []
    for reverse in (False, True):
        graph = taskgraph.build(every_rank_starts_its_own_group(8, reverse).trace)
        stuck = deadlock.Search(graph).run().stuck
        wfg = deadlock._Explanation(deadlock.Search(graph), *stuck).wfg
        assert sum(1 for _ in islice(nx.simple_cycles(wfg), 501)) == 501
        hazard = deadlock.report(graph, *stuck)
        reports.append((hazard.message, hazard.where, hazard.streams, hazard.ops, hazard.key))
    assert reports[1] == reports[0]
    # the shortest circular wait through the first rank's head, the first stream first
    assert cycle_of(reports[0][0]) == (
        "all_reduce[g0#1]@npu:0/s -> all_reduce[g0#1]@npu:1/s -> all_reduce[g1#1]@npu:1/s"
        " -> all_reduce[g1#1]@npu:0/s -> all_reduce[g0#1]@npu:0/s")


def test_a_wait_for_graph_with_astronomically_many_cycles_is_explained_without_enumerating_them():
    """64 ranks, each waiting for all 63 others: about 63! * e simple cycles.  The cycle is
    picked by a few breadth-first searches, and is the shortest (the best of the first 500
    enumerated was a 59-rank one)."""
    messages = set()
    for reverse in (False, True):
        (hazard,) = deadlocks(every_rank_starts_its_own_group(64, reverse).trace)
        messages.add(hazard.message)
        assert cycle_of(hazard.message) == (
            "all_reduce[g0#1]@npu:0/s -> all_reduce[g0#1]@npu:1/s -> all_reduce[g1#1]@npu:1/s"
            " -> all_reduce[g1#1]@npu:0/s -> all_reduce[g0#1]@npu:0/s")
    assert len(messages) == 1


def test_dense_hold_and_wait_ops_give_the_cycle_through_all_of_them_in_stream_order():
    """48 resident ops on one device each hold one of its 48 vector cores and wait for the
    rest (a state built by hand: ``report`` explains any stuck state): each waits for every
    other, a complete wait-for graph with about 47! * e cycles.  The cycle shown passes every
    hold-and-wait op, stream by stream."""
    b = Build(devices=1, vector=48)
    for i in range(48):
        b.kernel(b.stream(f"s{i:02}", 0), op=f"nonzero{i:02}", vector=48, resident=True, line=100 + i)
    hazard = deadlock.report(taskgraph.build(b.trace), (0,) * 48, ((0, 1, False),) * 48)
    assert cycle_of(hazard.message) == " -> ".join(f"nonzero{i:02}@npu:0/s{i:02}" for i in [*range(48), 0])


def test_circular_wait_is_a_function_of_the_graph_alone():
    """Random graphs, each built in two insertion orders: the same simple cycle, one exactly when
    the graph has a cycle, through a preferred node when one lies on a cycle, and without one
    the shortest cycle through the smallest node on a cycle."""
    import random

    import networkx as nx

    rng = random.Random(0)
    for _ in range(400):
        nodes = list(range(rng.randint(1, 9)))
        density, preferred = rng.random() * 0.5, {n for n in nodes if rng.random() < 0.3}
        edges = [(a, b) for a in nodes for b in nodes if rng.random() < density and (a != b or rng.random() < 0.1)]
        graphs = []
        for _ in range(2):
            rng.shuffle(nodes)
            rng.shuffle(edges)
            graph = nx.DiGraph()
            graph.add_nodes_from(nodes)
            graph.add_edges_from(edges)
            graphs.append(graph)
        picked = [deadlock.circular_wait(g, lambda n: n, preferred.__contains__) for g in graphs]
        assert picked[0] == picked[1], edges
        cycle, cycles = picked[0], list(nx.simple_cycles(graphs[0]))
        assert bool(cycle) == bool(cycles)
        if not cycle:
            continue
        assert len(set(cycle)) == len(cycle)
        assert all(graphs[0].has_edge(a, b) for a, b in zip(cycle, cycle[1:] + cycle[:1]))
        on_cycle = set().union(*cycles)
        if on_cycle & preferred:
            assert cycle[0] == min(on_cycle & preferred)
        else:
            assert cycle[0] == min(on_cycle)
            assert len(cycle) == min(len(c) for c in cycles if cycle[0] in c)
