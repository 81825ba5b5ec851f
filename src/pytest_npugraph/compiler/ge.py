"""GE mode (``max-autotune``): the Graph Engine runs the whole FX graph on its own streams.

What the emulation keeps of GE (reference torchair_api.md §1.3, §7.1, §7.4):
* every op runs on a GE stream: the graph's main stream, or the stream of its ``npu_stream_switch``
  tag (same tag, same stream, within the graph);
* the graph is ordered after earlier work on the launching stream (fork at start) and later work
  on it is ordered after the whole graph (join at the end);
* the compiler synchronises every data edge between streams: an event recorded after the producer
  and waited before the first consumer on each other stream;
* ``npu_wait_tensor(a, b)`` is an Identity of ``a`` on its scope's stream with a control edge from
  ``b``'s producer; ``torchair.ops.record/wait`` become the same kind of edge;
* ``limit_core_num`` is per op (the kernel's limits), ``ge_config.aicore_num`` ("A|V") per graph;
* ``super_kernel(name, options)``: consecutive ops of one scope name form a SuperKernel, recorded as
  ``SuperKernelBegin``/``SuperKernelEnd`` markers around them
  (read by the ``super-kernel`` analysis); an op that cannot be fused (an AICPU or ATB kernel, a
  collective other than AllReduce, ReduceScatter, AllGather and AlltoAll: its op profile says which)
  closes the SuperKernel, runs on its own, and the next op of the scope opens a new one (§7.8);
* tagged events are rejected when the graph is converted (NotImplementedError, as GE's converters).
"""
from __future__ import annotations

import itertools
import sys

import torch

from ..runtime import profiles
from ..runtime.runtime import current
from ..trace import GRAPH_STREAM_BASE
from ..runtime.callsite import first_user
from ..runtime.planned import Stretch
from . import data_dump, emit, export, fxgraph, ge_options, ge_plan
from ..graph_record import GraphOp, GraphRecord
from .runner import Runner, device_of, on_device, record_node, wait_node

_SKIPPED = {fxgraph.SCOPE_ENTER, fxgraph.SCOPE_EXIT}
_REJECTED = ("air.tagged_event_record", "air.tagged_event_wait", "air.record_tagged_stream",
             "air.tagged_event_record_on_stream", "air.tagged_event_wait_on_stream", "air.tagged_stream_wait_stream")


def internal_stream(rt, device: int, label: str):
    """A stream owned by a compiled graph (GE's streams have no torch handle of their own)."""
    ids = rt.extensions.setdefault("compiler.stream_ids", itertools.count())
    stream_id = GRAPH_STREAM_BASE + next(ids)
    state = rt.new_stream(device, stream_id, f"npu:{device}/{label}")
    rt.devices[device].streams[stream_id] = state
    return state


def parse_aicore_num(value, device):
    """``ge_config.aicore_num`` "A|V" (or "A|" / "A") -> (cube, vector) limits clamped to the chip."""
    if value is None:
        return None, None
    cube, _, vector = str(value).partition("|")
    return (min(int(cube), device.cube_cores) if cube.strip() else None,
            min(int(vector), device.vector_cores) if vector.strip() else None)


def _tagged_in_ge_hint(node) -> str:
    """What TorchAir's error leaves out: the user's line and what to write instead."""
    site = fxgraph.node_site(node)
    call = fxgraph.target_name(node).split(".")[1]
    where = f"{site}" if site is not None else "your model"
    return (f"\n{where}: torchair.ops.npu_{call} (a tagged event) orders streams in reduce-overhead (aclgraph) "
            f"mode only; this graph compiles in GE mode (CompilerConfig().mode = \"max-autotune\", the default). "
            f"Fix: compile with config.mode = \"reduce-overhead\", or in GE mode drop the tagged events: GE "
            f"orders a stream scope's data inputs itself, and torchair.ops.npu_wait_tensor(consumer_input, "
            f"producer_output) adds an ordering edge where no data flows.")


class GeGraph:
    """A compiled FX graph in GE mode; calling it runs the graph (see the module docstring)."""

    def __init__(self, gm, settings, name: str, label: str = ""):
        for node in gm.graph.nodes:
            if fxgraph.target_name(node).rsplit(".", 1)[0] in _REJECTED:
                raise NotImplementedError(f"torch.ops.{fxgraph.target_name(node)} ge_converter is not implemented!"
                                          + _tagged_in_ge_hint(node))
        self.gm = gm
        self.name = name                 # TorchAir's ("graph_1": dumps, exports)
        self.label = label or name       # the reports' (graph_names: the user's function)
        self.aicore_num = settings.aicore_num
        self.scope = fxgraph.scopes(gm)
        self.lane = self._lanes(gm)
        self.ops = [GraphOp(n.name, fxgraph.target_name(n), self.lane[n]) for n in gm.graph.nodes
                    if n.op not in ("placeholder", "output")]
        self.record = None
        self._plan_edges(gm)
        self.export = settings.export
        self.settings = settings
        self.data_dump = None if settings.data_dump_path is None else data_dump.GeDump(gm, name, settings)
        self._runner = _GeRunner(self)
        self._generation = None
        self.streams: dict = {}
        self.events: dict = {}
        self.plan = None                       # this test's GePlan (ge_plan.py), once recorded
        self.plan_reason = ge_plan.unplannable_reason(self)    # why runs go op by op ('' while a plan may come)
        self._payload_modules: dict = {}       # device -> (payload module or None, why not)
        self._plan_tries = 0
        self._loaded = False                   # TorchAir loads (and logs its options) at the first run

    # ---------------------------------------------------------------- compile time
    def _lanes(self, gm) -> dict:
        lanes = {}
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "get_attr", "output"):
                lanes[node] = None
            elif fxgraph.target_name(node) == "<built-in function getitem>":
                lanes[node] = lanes[node.args[0]]      # a piece of its producer's result
            else:
                lanes[node] = self.scope[node].stream
        return lanes

    def _plan_edges(self, gm) -> None:
        """Which events each node records after it and waits for before it (data edges between
        streams; graph inputs are covered by the fork)."""
        self.waits: dict = {}
        self.after: dict = {}
        waited = set()
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "get_attr", "output") or fxgraph.target_name(node) in _SKIPPED:
                continue
            lane = self.lane[node]
            for src in node.all_input_nodes:
                if src.op in ("placeholder", "get_attr") or self.lane[src] == lane:
                    continue
                producer = src
                while fxgraph.target_name(producer) == "<built-in function getitem>":
                    producer = producer.args[0]
                if (producer, lane) not in waited:
                    waited.add((producer, lane))
                    self.after.setdefault(producer, []).append((producer, lane))
                    self.waits.setdefault(node, []).append((producer, lane))

    # -------------------------------------------------------------------- run time
    def _setup(self, rt, device: int) -> None:
        """This test's GE streams and events (a compiled graph may outlive a test)."""
        d = rt.devices[device]
        cube, vector = parse_aicore_num(self.aicore_num, d)
        self.streams = {}
        for lane in sorted({lane for lane in self.lane.values()}, key=lambda x: (x is not None, str(x))):
            name = f"{self.label}:main" if lane is None else f"{self.label}:tag '{lane}'"
            state = self.streams[lane] = internal_stream(rt, device, name)
            state.cube_limit, state.vector_limit = cube, vector
        self.events = {edge: rt.new_event(f"{self.label} edge") for waits in self.waits.values() for edge in waits}
        self.fork = rt.new_event(f"{self.label} fork")
        self.joins = {lane: rt.new_event(f"{self.label} join") for lane in self.streams}
        self._generation = (rt.generation, device)
        self.record = GraphRecord(self.name, "max-autotune", self.ops, fx_graph=self.gm, label=self.label)
        rt.graphs.append(self.record)
        self.plan = None
        self._plan_tries = 0
        if self.plan_reason.startswith("recorded run: "):
            self.plan_reason = ""

    def __call__(self, *args):
        if self.export is not None:             # dynamo_export: write the export, do not run
            export.export(self.gm, self.name, self.lane, args, self.settings)
        if not self._loaded:
            self._loaded = True
            ge_options.log_compile_options(self.gm, self.settings, args)
        rt = current()
        device = device_of(args, rt)
        if self._generation != (rt.generation, device):
            self._setup(rt, device)
        self.record.runs += 1
        with on_device(device, rt):
            plan = self.plan
            if (plan is not None or not self.plan_reason) and ge_plan.ENABLED:
                key, blocks = ge_plan.GePlan.key_of(rt, device, args)
                if key is not None:
                    launch = rt.current_stream(device)
                    if ge_plan.GePlan.usable(rt, [launch, *self.streams.values()]):
                        if plan is None:
                            return self._record_plan(rt, device, args, key, blocks, launch)
                        if key == plan.key:
                            return plan.run(rt, args, key, blocks)
            return self._runner.run(*args)

    def _record_plan(self, rt, device, args, key, blocks, launch):
        """Run op by op, recording the run; make the plan later runs use (ge_plan.py)."""
        found = self._payload_modules.get(device)
        if found is None:
            found = self._payload_modules[device] = ge_plan.payload_module(self.gm, device)
        math, why = found
        if math is None:
            self.plan_reason = why
            return self._runner.run(*args)
        caller = first_user(sys._getframe(2))
        start = len(rt.trace.log)
        watch = Stretch.watch_recording(rt, device)
        runner = self._runner
        runner.windows = []
        try:
            outputs = runner.run(*args)
        finally:
            windows, runner.windows = runner.windows, None
        self._plan_tries += 1
        try:
            self.plan = ge_plan.GePlan.build(self, math, rt, device, args, blocks, key, start, len(rt.trace.log),
                                             launch, windows, caller, outputs, watch)
        except ge_plan.Unplannable as error:
            if self._plan_tries >= 2:
                self.plan_reason = f"recorded run: {error}"
        return outputs


class _GeRunner(Runner):
    def __init__(self, graph: GeGraph):
        super().__init__(graph.gm)
        self.graph = graph
        self.windows = None         # while a run is recorded for a plan: (first seq, end seq, site) per node

    def begin(self, rt, args) -> None:
        g = self.graph
        self.device = device_of(args, rt)
        self.launch = rt.current_stream(self.device)
        self.super_kernel = None                  # (scope name, options, stream) of the open SuperKernel
        rt.record_event(g.fork, self.launch)
        for stream in g.streams.values():
            rt.wait_event(g.fork, stream)
        if g.data_dump is not None:
            g.data_dump.begin(g.record.runs - 1, self.device)
        self.task_id = 0

    def finish(self, rt, outputs):
        g = self.graph
        self._enter_super_kernel(rt, None, None)
        main = g.streams[None]
        for lane, stream in g.streams.items():
            if lane is not None:
                rt.record_event(g.joins[lane], stream)
                rt.wait_event(g.joins[lane], main)
        rt.record_event(g.joins[None], main)
        rt.wait_event(g.joins[None], self.launch)
        return outputs

    def end(self, rt) -> None:
        rt.set_current_stream(self.launch)

    def execute(self, rt, node, args, kwargs):
        g = self.graph
        name = fxgraph.target_name(node)
        if name in _SKIPPED:
            return None
        if self.windows is not None and self.sites[node] is not None:
            start = len(rt.trace.log)
            result = self._execute(rt, node, name, args, kwargs)
            self.windows.append((start, len(rt.trace.log), self.sites[node]))
            return result
        return self._execute(rt, node, name, args, kwargs)

    def _execute(self, rt, node, name, args, kwargs):
        g = self.graph
        stream = g.streams[g.lane[node]]
        for edge in g.waits.get(node, ()):
            rt.wait_event(g.events[edge], stream)
        rt.set_current_stream(stream)
        scope = g.scope.get(node)
        self._enter_super_kernel(rt, scope if _fusable(node, rt, self.device) else None, stream)
        saved = stream.cube_limit, stream.vector_limit
        if scope is not None and scope.aicore is not None:
            stream.cube_limit, stream.vector_limit = scope.aicore, scope.vectorcore
        try:
            if name == "air.wait_tensor.default":
                result = args[0]                      # Identity; the control edge is in the waits
            elif name == "air.record.default":
                result = record_node(rt)
            elif name == "air.wait.default":
                # a waited tensor is a data edge: its producer's event was waited above (g.waits)
                result = wait_node([a for a in args[0] if not isinstance(a, torch.Tensor)])
            else:
                result = self.call(node, args, kwargs)
        finally:
            stream.cube_limit, stream.vector_limit = saved
        self.task_id += 1
        if g.data_dump is not None:
            g.data_dump.node(node, args, kwargs, result, stream.sid, self.task_id)
        for edge in g.after.get(node, ()):
            rt.record_event(g.events[edge], stream)
        return result

    def _enter_super_kernel(self, rt, scope, stream) -> None:
        """Close the open SuperKernel and open the node's when the node's scope differs."""
        wanted = None if scope is None or scope.super_kernel is None else (scope.super_kernel,
                                                                          scope.super_kernel_options)
        if self.super_kernel is not None and self.super_kernel[:2] != wanted:
            emit.super_kernel_end(rt, self.super_kernel[2], self.super_kernel[:2])
            self.super_kernel = None
        if wanted is not None and self.super_kernel is None:
            emit.super_kernel_begin(rt, stream, wanted, scope.super_kernel_site)
            self.super_kernel = (*wanted, stream)


_FUSABLE_COLLECTIVES = {"all_reduce", "allreduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
                        "all_gather_into_tensor", "allgather", "all_to_all", "all_to_all_single", "alltoall"}


def _fusable(node, rt, device: int) -> bool:
    """Whether GE can put the node's kernel into a SuperKernel (reference §7.8: AI Core and vector
    kernels and the four supported collectives; not AICPU or ATB kernels)."""
    name = getattr(node.target, "name", None)
    if not callable(name):
        return True                              # no kernel of its own (getitem, views, scope ops)
    op = name()
    cores = profiles.resolve(op, rt.devices[device])
    if cores.kind in ("AICPU", "ATB"):
        return False
    if cores.kind == "HCCL":
        return op.split("::")[-1].split(".")[0].rstrip("_") in _FUSABLE_COLLECTIVES
    return True

