"""GE mode's plan against its op-by-op run (compiler/ge_plan.py): random small graphs (elementwise ops,
matmuls, views, casts, host constants, random numbers, in-place updates of an input, ``npu_wait_tensor``
edges) across one to three streams (``npu_stream_switch`` scopes), called several times from user code
that writes the inputs on a side stream and reads the outputs there, with or without the waits that
order them.  Each program runs twice on a fresh emulated machine: every GE run op by op, then with
plans (the first call of a graph records, the later ones run the plan).  The two must give the same
values, the same trace (every record: kind, stream, op, event, site, memory relative to its block and
the allocator's region, allocation reuse) and the same hazards.

``NPUGRAPH_GE_PLAN_EXAMPLES`` (default 25) sets the number of programs.
"""
from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from torchair import scope

from pytest_npugraph import trace as T
from pytest_npugraph._context import CONTEXT
from pytest_npugraph.analysis import analyze
from pytest_npugraph.compiler import ge_plan
from pytest_npugraph.runtime.allocator import REGION
from pytest_npugraph.runtime.runtime import current

from .helpers import compile_with

EXAMPLES = int(os.environ.get("NPUGRAPH_GE_PLAN_EXAMPLES", "25"))
TAGS = (None, "1", "2")
UNARY = ("sin", "relu", "neg", "double", "plus1", "cast", "t", "rand")
BINARY = ("add", "mul", "sub", "matmul")


@st.composite
def programs(draw):
    """(graph ops, outputs, user-code choices).  Values: 0 and 1 are the inputs (4x4); op i makes value i + 2."""
    ops = []
    for i in range(draw(st.integers(1, 7))):
        n = i + 2
        tag = draw(st.sampled_from(TAGS))
        kind = draw(st.sampled_from(["unary"] * 3 + ["binary"] * 3 + ["const", "wait", "inplace"]))
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        op = draw(st.sampled_from(UNARY if kind == "unary" else BINARY))
        ops.append((kind, op, a, b, tag))
    n = len(ops) + 2
    outs = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))) | {n - 1})
    user = draw(st.fixed_dictionaries({
        "calls": st.integers(2, 4),
        "write_input_on_side": st.booleans(),       # the user updates x on a side stream before each call
        "wait_for_write": st.booleans(),            # ... and orders the call after it
        "read_output_on_side": st.booleans(),       # the user reads an output on the side stream
        "wait_for_graph": st.booleans(),            # ... after ordering the side stream after the call
        "keep_outputs": st.booleans(),              # outputs of every call kept alive (else dropped)
    }))
    return ops, outs, user


def graph_fn(ops, outs):
    def f(x, y):
        v = [x, y]
        for kind, op, a, b, tag in ops:
            with scope.npu_stream_switch(tag) if tag is not None else _nothing():
                v.append(_apply(kind, op, v, a, b))
        return tuple(v[i] for i in outs)
    return f


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _apply(kind, op, v, a, b):
    x, y = v[a], v[b]
    if kind == "const":
        return x + torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)     # a host constant copied in
    if kind == "wait" and a >= 2:          # (AOTAutograd refuses an Identity of an input the graph updates)
        scope.npu_wait_tensor(x, y)
        return x * 0.5
    if kind == "wait":
        return x * 0.5
    if kind == "inplace":
        v[0].add_(1)                    # the graph updates its input (a copy_ epilogue)
        return v[0] * y
    if kind == "binary":
        return {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "matmul": torch.matmul}[op](x, y)
    return {"sin": torch.sin, "relu": torch.relu, "neg": torch.neg, "double": lambda t: t * 2,
            "plus1": lambda t: t + 1, "cast": lambda t: t.to(torch.float16).float(),
            "t": lambda t: t.t(), "rand": lambda t: t + torch.rand_like(t)}[op](x)


def run_program(compiled, user, plans: bool):
    """The user code around the graph on a fresh machine; (values, normalised trace, hazards, plan runs)."""
    CONTEXT.begin(CONTEXT.config, CONTEXT.test_hook)
    ge_plan.ENABLED = plans
    try:
        torch.npu.manual_seed(7)
        x = torch.arange(16, dtype=torch.float32).view(4, 4).div(16).npu()
        y = torch.ones(4, 4, device="npu") * 0.25
        side = torch.npu.Stream()
        main = torch.npu.current_stream()
        values, kept = [], []
        for _ in range(user["calls"]):
            if user["write_input_on_side"]:
                side.wait_stream(main)
                with torch.npu.stream(side):
                    y.mul_(1.5)
                if user["wait_for_write"]:
                    main.wait_stream(side)
            outs = compiled(x, y)
            if user["read_output_on_side"]:
                if user["wait_for_graph"]:
                    side.wait_stream(main)
                with torch.npu.stream(side):
                    sums = [o.sum() for o in outs]
                main.wait_stream(side)
                values.extend(s.cpu() for s in sums)
            values.extend(o.cpu() for o in outs)
            if user["keep_outputs"]:
                kept.append(outs)
            del outs
        torch.npu.synchronize()
        values.append(x.cpu())
        rt = current()
        trace = normalised(rt.trace)
        hazards = [(h.kind, h.severity, _ADDRESS.sub(_in_region, h.message), tuple(h.where), tuple(h.streams),
                    tuple(h.ops), h.seqs) for h in analyze(rt.trace)]
        planned = sum(1 for r in rt.trace.records if isinstance(r, T.Kernel)) if plans else 0
        del kept
        return values, trace, hazards, planned
    finally:
        ge_plan.ENABLED = True


_ADDRESS = re.compile(r"0x[0-9a-f]+")


def _in_region(match) -> str:
    """An address in a report as its offset in the allocator's region (each machine has its own)."""
    return hex(int(match.group(0), 16) % REGION)


def normalised(trace) -> list:
    """Every record with process-wide ids made test-relative: streams and events by label, blocks by
    order of allocation, addresses by their offset in the allocator's region."""
    blocks: dict = {}

    def block(bid):
        return blocks.setdefault(bid, len(blocks)) if bid is not None else None

    def span(s):
        return (s.device, s.lo % REGION, s.hi % REGION, block(s.block), s.run, s.dims)

    out = []
    for r in trace.records:
        d = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
        if "stream" in d and d["stream"] is not None:
            d["stream"] = trace.streams[d["stream"]].label
        if "event" in d and isinstance(d["event"], int):
            d["event"] = trace.events[d["event"]].label
        for name in ("reads", "writes"):
            if name in d:
                d[name] = tuple(span(s) for s in d[name])
        if isinstance(r, (T.Alloc, T.Free, T.RecordStream)):
            d["block"] = block(d["block"])
            info = trace.blocks[r.block]
            d["size"] = (info.lo % REGION, info.size, info.site, trace.streams[info.stream].label)
        if isinstance(r, T.Alloc):
            d["reuses"] = block(d["reuses"])
        if "spans" in d:
            d["spans"] = tuple(span(s) for s in d["spans"])
        if "span" in d:
            d["span"] = span(d["span"])
        out.append((type(r).__name__, tuple(sorted(d.items(), key=lambda kv: kv[0]))))
    return out


def test_plans_give_the_op_by_op_values_trace_and_hazards(npugraph):
    base = CONTEXT.config
    tally = {"programs": 0, "planned": 0, "with hazards": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=(Phase.explicit, Phase.generate),      # a compile per program: shrinking takes minutes
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(programs())
    def same(program):
        ops, outs, user = program
        note(repr(program))
        torch._dynamo.reset()
        before = _ge_graphs()
        compiled = compile_with(graph_fn(ops, outs))
        old = run_program(compiled, user, plans=False)
        new = run_program(compiled, user, plans=True)
        assert len(old[0]) == len(new[0])
        for a, b in zip(old[0], new[0]):
            assert torch.equal(a, b), (a, b)
        assert len(old[1]) == len(new[1])
        for i, (a, b) in enumerate(zip(old[1], new[1])):
            assert a == b, (i, a, b)
        assert old[2] == new[2]
        graphs = _ge_graphs(since=before)
        tally["programs"] += 1
        tally["planned"] += any(g.plan is not None for g in graphs)
        tally["with hazards"] += bool(new[2])

    try:
        same()
    finally:
        CONTEXT.begin(base, CONTEXT.test_hook)
    # the comparison means something only if plans ran and hazards were found in some programs
    assert tally["planned"] >= tally["programs"] * 3 // 4, tally
    assert tally["with hazards"] >= 1, tally


def _ge_graphs(since=()):
    """The GE graphs alive and fully built (a graph whose converter check raised is half-built; other
    tests' may still be alive in this process), other than those in ``since``."""
    import gc

    from pytest_npugraph.compiler.ge import GeGraph

    return [o for o in gc.get_objects() if type(o) is GeGraph and "plan" in vars(o) and o not in since]


def test_a_plan_is_used_from_the_second_call_and_its_runs_append_what_op_by_op_runs_do(npugraph):
    def f(x, y):
        a = x + 1
        with scope.npu_stream_switch("s"):
            b = a @ y
        return b.relu() + a

    compiled = compile_with(f)
    x, y = torch.ones(4, 4, device="npu"), torch.full((4, 4), 0.5, device="npu")
    counts = []
    for _ in range(3):
        start = len(npugraph.trace.records)
        out = compiled(x, y)
        counts.append([type(r).__name__ for r in npugraph.trace.records[start:]])
        assert out.cpu().tolist() == [[6.0] * 4] * 4
        del out
    (graph,) = [g for g in _ge_graphs() if g.record is npugraph.graphs[0]]
    assert graph.plan is not None and graph.plan_reason == ""
    assert counts[0] == counts[1] == counts[2]
    assert npugraph.graphs[0].runs == 3
    npugraph.assert_clean()


def test_a_graph_with_a_host_read_goes_op_by_op(npugraph):
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        def f(x):
            return torch.nonzero(x > 0.5).sum() + x.sum()

        compiled = compile_with(f)
        x = torch.rand(8, device="npu")
        for _ in range(3):
            out = compiled(x)
        assert out.cpu().item() == pytest.approx(torch.nonzero(x.cpu() > 0.5).sum().item() + x.cpu().sum().item())
    (graph,) = [g for g in _ge_graphs() if g.record in npugraph.graphs]
    assert graph.plan is None and graph.plan_reason      # nonzero's size is a host read, checked by a SymInt
    assert npugraph.graphs[0].runs == 3


@pytest.mark.npu_devices(2)
def test_a_graph_whose_run_makes_events_goes_op_by_op(npugraph):
    def f(x):
        return (x * 2).to("npu:1") + 1        # a copy between devices: events made by each run

    compiled = compile_with(f)
    x = torch.ones(4, device="npu:0")
    for _ in range(3):
        out = compiled(x)
    assert out.device == torch.device("npu:1") and out.cpu().tolist() == [3.0] * 4
    (graph,) = [g for g in _ge_graphs() if g.record in npugraph.graphs]
    assert graph.plan is None and graph.plan_reason == "recorded run: work on a stream outside the graph (npu:1/default)"
    npugraph.assert_clean()


# ---------------------------------------------------------------- allocation schedules
# After its recorded run, a plan's run applies the allocator's part of the run at once when the free
# lists are those the recorded run started from (runtime/alloc_schedule.py).  Between calls the user
# code below changes the allocator's state (or not), so that runs take the schedule, miss it and learn
# again; the allocator's statistics and segments are compared as well as the values and the trace.
BETWEEN = ("nothing", "nothing", "keep_outputs", "drop_kept", "alloc_kept", "alloc_dropped", "empty_cache",
           "record_stream", "synchronize", "low_fraction", "side_stream")


@st.composite
def schedule_programs(draw):
    ops, outs, _ = draw(programs())
    between = draw(st.lists(st.sampled_from(BETWEEN), min_size=6, max_size=6))
    sizes = draw(st.lists(st.integers(1, 300_000), min_size=6, max_size=6))
    return ops, outs, {"calls": draw(st.integers(3, 6)), "between": between, "sizes": sizes}


def run_schedule_program(compiled, user, plans: bool):
    """The user code around the graph on a fresh machine: (values, trace, hazards, memory per call, graphs)."""
    CONTEXT.begin(CONTEXT.config, CONTEXT.test_hook)
    ge_plan.ENABLED = plans
    try:
        torch.npu.manual_seed(7)
        x = torch.arange(16, dtype=torch.float32).view(4, 4).div(16).npu()
        y = torch.ones(4, 4, device="npu") * 0.25
        side = torch.npu.Stream()
        values, kept, held, memory = [], [], [], []
        last = None
        for i in range(user["calls"]):
            action = user["between"][i]
            if action == "drop_kept":
                kept.clear()
            elif action == "alloc_kept":
                held.append(torch.empty(user["sizes"][i], device="npu"))
            elif action == "alloc_dropped":
                torch.empty(user["sizes"][i], device="npu").fill_(1.0)
            elif action == "empty_cache":
                torch.npu.empty_cache()
            elif action == "record_stream" and last is not None:
                side.wait_stream(torch.npu.current_stream())
                with torch.npu.stream(side):
                    values.append(last[0].sum().cpu())
                last[0].record_stream(side)        # its free waits for the side stream (pending)
            elif action == "synchronize":
                torch.npu.synchronize()
            elif action == "low_fraction":          # no room for another segment
                allocator = current().devices[0].allocator
                torch.npu.set_per_process_memory_fraction(allocator.reserved / allocator.capacity)
            last = None
            if action == "side_stream":
                side.wait_stream(torch.npu.current_stream())
                with torch.npu.stream(side):
                    outs = compiled(x, y)
                torch.npu.current_stream().wait_stream(side)
            else:
                try:
                    outs = compiled(x, y)
                except torch.OutOfMemoryError as error:
                    values.append(_ADDRESS.sub(_in_region, str(error)))
                    continue
            values.extend(o.cpu() for o in outs)
            if action == "keep_outputs":
                kept.append(outs)
            last = outs
            del outs
            memory.append((torch.npu.memory_stats(), _snapshot()))
        last = None
        kept.clear()
        held.clear()
        memory.append((torch.npu.memory_stats(), _snapshot()))
        torch.npu.synchronize()
        values.append(x.cpu())
        rt = current()
        trace = normalised(rt.trace)
        hazards = [(h.kind, h.severity, _ADDRESS.sub(_in_region, h.message), tuple(h.where), tuple(h.streams),
                    tuple(h.ops), h.seqs) for h in analyze(rt.trace)]
        return values, trace, hazards, memory, list(rt.graphs)
    finally:
        ge_plan.ENABLED = True
        torch.npu.set_per_process_memory_fraction(1.0)


def _snapshot() -> list:
    """The allocator's segments and blocks, addresses as offsets in its region."""
    def norm(d):
        return {k: (v % REGION if k == "address" else [norm(b) for b in v] if k == "blocks" else v)
                for k, v in d.items() if k != "stream"}
    return [norm(seg) for seg in torch.npu.memory_snapshot()]


def test_allocation_schedules_give_the_op_by_op_allocator_state(npugraph):
    from pytest_npugraph.runtime.planned import FastRun

    base = CONTEXT.config
    tally = {"programs": 0, "scheduled runs": 0, "with schedule misses": 0}
    fast_runs = []
    run = FastRun.run

    def counted(self, *args):
        result = run(self, *args)
        fast_runs.append(result is not None)
        return result

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=(Phase.explicit, Phase.generate),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(schedule_programs())
    def same(program):
        ops, outs, user = program
        note(repr(program))
        torch._dynamo.reset()
        compiled = compile_with(graph_fn(ops, outs))
        old = run_schedule_program(compiled, user, plans=False)
        del fast_runs[:]
        new = run_schedule_program(compiled, user, plans=True)
        assert len(old[0]) == len(new[0])
        for a, b in zip(old[0], new[0]):
            assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), (a, b)
        assert len(old[1]) == len(new[1])
        for i, (a, b) in enumerate(zip(old[1], new[1])):
            assert a == b, (i, a, b)
        assert old[2] == new[2]
        assert len(old[3]) == len(new[3])
        for i, ((stats_a, snap_a), (stats_b, snap_b)) in enumerate(zip(old[3], new[3])):
            assert stats_a == stats_b, (i, {k: (v, stats_b.get(k)) for k, v in stats_a.items() if stats_b.get(k) != v})
            assert snap_a == snap_b, i
        tally["programs"] += 1
        tally["scheduled runs"] += sum(fast_runs)
        tally["with schedule misses"] += not all(fast_runs)

    FastRun.run = counted
    try:
        same()
    finally:
        FastRun.run = run
        CONTEXT.begin(base, CONTEXT.test_hook)
    # the schedules were taken, and missed, in some programs
    assert tally["scheduled runs"] >= tally["programs"], tally
    assert tally["with schedule misses"] >= 1, tally


def test_a_plan_computes_the_graphs_constants_once_and_never_hands_them_out(npugraph):
    def f(x):
        mask = torch.ones(4, 4, dtype=torch.bool, device=x.device).tril()      # no input: folded
        positions = torch.arange(4, device=x.device).float()
        fresh = torch.zeros(4, device=x.device)      # an output: each call's own tensor
        return x.masked_fill(~mask, -1.0) + positions, fresh, positions.view(2, 2)

    compiled = compile_with(f)
    x = torch.full((4, 4), 0.5, device="npu")
    expected = torch.full((4, 4), 0.5).masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), -1.0) + \
        torch.arange(4).float()
    for _ in range(6):
        out, fresh, view = compiled(x)
        assert torch.equal(out.cpu(), expected)
        assert fresh.cpu().tolist() == [0.0] * 4 and view.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]
        fresh.add_(1)           # the caller changes its outputs in place: the next call is not affected
        view.mul_(0)
    (graph,) = [g for g in _ge_graphs() if g.record in npugraph.graphs]
    # the previous call's outputs are alive during a call: two allocator states alternate, two schedules
    assert graph.plan is not None and sum(fast.runs for fast in graph.plan.stretch.fast) >= 1
    assert any(name.startswith("_folded_constant") for name, _ in graph.plan.math.named_buffers())
    npugraph.assert_clean()
