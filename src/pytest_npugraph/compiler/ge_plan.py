"""GE mode's plan: a GE graph runs its math on the CPU payloads and appends a recorded run's work.

A GE graph is static (reference torchair_api.md §1.3: GE compiles a fixed graph with fixed streams,
events and memory), so every run issues the same tasks, events and allocations.  The first run of
a graph in a test goes op by op through the NPU tensors (``ge._GeRunner``) and is recorded
(``runtime.planned.Stretch``); later runs execute ``payload_module`` (the FX graph over plain CPU
tensors, at the cost of ``aot_eager``; its constant-only nodes computed once) and append the recorded
work with fresh memory (``planned.FastRun``: the allocator's part of a run applied at once).  Values,
trace records (kinds, streams, order, sites) and so every hazard and report are those of an
op-by-op run; tests/graph/test_ge_plan.py checks that on random graphs.

No plan (every run goes op by op) when the graph has:
* symbolic shapes or non-tensor inputs (a dynamic graph: its work changes with its inputs);
* an op whose effect the trace does not show: ``air``/``npugraph_ex`` ops but scopes and
  ``npu_wait_tensor`` (``npu_print``, ``air.record``/``air.wait``, whose events are made per run),
  an op with the user's own npu-key kernel, ``npu_format_cast``, ``set_``, in-place metadata ops
  (``resize_``...), a call of a Python function or method;
* a data dump (``dump_config``) or ``dynamo_export`` (each run writes files);
and when the recorded run holds anything ``Stretch.record`` refuses: a host sync or a host read
(``.item()``, data-dependent shapes), ``record_stream``, a collective, events made while it ran, an
input that is a graph call's output, work outside the graph's streams.

A run that cannot use the plan goes op by op too: another thread's ``run_ranks`` rank, a stream
with queued work or the ``shuffle`` schedule (executor.py), a capture on the calling stream, a
``use_mem_pool`` routing, a site hint or a dispatch mode in force, a device core limit changed
since the recorded run, or inputs whose layout (offset, shape, strides) or sharing of memory
differs from the recorded run's.  Random ops draw from the device's generator in graph order,
as op by op.  An out-of-memory error is raised after the run's math (op by op: before the op).
"""
from __future__ import annotations

import operator
import sys

import torch
from torch.fx.node import map_aggregate

from ..runtime import cpu_gaps, generators, mixed_precision, special_ops, transfers, user_kernels
from ..runtime.callsite import first_user
from ..runtime.planned import Stretch, Unplannable
from ..runtime.runtime import current
from ..runtime.tensor import METADATA_INPLACE, NpuTensor, _plan, _remember_block
from . import fxgraph
from .runner import _dense_kernel

ENABLED = True      # False: every run goes op by op (the differential test compares the two)

_KEPT_AIR = {fxgraph.SCOPE_ENTER, fxgraph.SCOPE_EXIT, "air.wait_tensor.default"}
# dispatch handlers whose effects all show in the trace (the recorded run is checked) or that run
# the op on its payloads: a node dispatched to any other handler stops the plan
_PLAIN_HANDLERS = (None, mixed_precision.promoted_product, transfers._copy, transfers._to_copy,
                   special_ops._npu_key_or_run, special_ops._host_read)
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_CPU = torch.device("cpu")


def _nothing(*args, **kwargs):
    return None


def _first(*args, **kwargs):
    return args[0]


def _cpu(value):
    return _CPU if isinstance(value, torch.device) and value.type == "npu" else value


def _widening(func):
    """``func``, computed as ``tensor._compute`` does when its CPU kernel lacks a dtype (cpu_gaps)."""
    kernels = {}

    def run(*args, **kwargs):
        kernel = kernels.get("k", func)
        try:
            return kernel(*args, **kwargs)
        except RuntimeError as error:
            gap = cpu_gaps.gap_dtype(func, error) if kernel is func else None
            if gap is None:
                raise
            kernel = kernels["k"] = cpu_gaps.widened(func, gap)
            return kernel(*args, **kwargs)
    run.__name__ = f"widening_{func.__name__.replace('.', '_')}"
    return run


def _drawing(func, device: int):
    """A random op drawing from npu:``device``'s generator (``tensor._compute``)."""
    def run(*args, **kwargs):
        with generators.drawing_on(current(), device):
            return func(*args, **kwargs)
    run.__name__ = f"drawing_{func.__name__.replace('.', '_')}"
    return run


def _promoting(func):
    """``mixed_precision.promoted_product`` on payloads: mixed floating operands cast first."""
    def run(*args, **kwargs):
        target = mixed_precision._promoted(args)
        if target is not None:
            args = tuple(a.to(target) if isinstance(a, torch.Tensor) and a.dtype != target else a for a in args)
        return func(*args, **kwargs)
    run.__name__ = f"promoting_{func.__name__.replace('.', '_')}"
    return run


def _static_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and not any(isinstance(d, torch.SymInt) for d in value.shape)


def payload_module(gm, device: int):
    """``(module, None)``: ``gm`` over CPU payloads (each op's CPU kernel, as dispatch runs it; scopes do
    nothing, ``npu_wait_tensor`` is its first input), or ``(None, why)`` when a node has no such form."""
    graph = torch.fx.Graph()
    env: dict = {}
    root = torch.nn.Module()
    for node in gm.graph.nodes:
        if node.op == "placeholder" and not _static_tensor(node.meta.get("val")):
            return None, f"input {node.name} is not a tensor of static shape"
        if node.op in ("call_method", "call_module"):
            return None, f"{node.op} {node.target}"
        new = graph.node_copy(node, env.__getitem__)
        env[node] = new
        if node.op == "get_attr":
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            if isinstance(value, NpuTensor):
                value = value._payload
            root.register_buffer(node.target.replace(".", "_"), value) if isinstance(value, torch.Tensor) \
                else setattr(root, node.target.replace(".", "_"), value)
            new.target = node.target.replace(".", "_")
            continue
        if node.op != "call_function":
            continue
        target = node.target
        if target is operator.getitem:
            continue
        name = fxgraph.target_name(node)
        if name in _KEPT_AIR:
            new.target = _nothing if name != "air.wait_tensor.default" else _first
            continue
        dense = _dense_kernel(target)
        if dense is not None:
            new.target = dense
            continue
        if not isinstance(target, torch._ops.OpOverload):
            return None, f"a call of {name}"
        if name.split(".")[0] in ("air", "npugraph_ex") or name in (fxgraph.SK_BEGIN, fxgraph.SK_END):
            return None, f"{name} acts on the host"
        plan = _plan(target)
        if plan.metadata_inplace or (plan.special not in _PLAIN_HANDLERS and not _host_read_if(plan.special)) or (
                plan.special is special_ops._npu_key_or_run and user_kernels.has_user_kernel(plan.name)):
            return None, f"{name} is not a plain kernel"
        new.args, new.kwargs = map_aggregate(new.args, _cpu), map_aggregate(new.kwargs, _cpu)
        if generators.seeded(target):
            new.target = _drawing(target, device)
        elif plan.special is mixed_precision.promoted_product and _mixed(node):
            new.target = _promoting(target)
        elif any(isinstance(v, torch.Tensor) and (v.dtype in _LOW_PRECISION or (
                 not v.is_floating_point() and plan.name in cpu_gaps.INTEGER_OPS))
                 for a in node.all_input_nodes for v in _values(a)):
            new.target = _widening(target)
    _fold_constants(graph, root)
    graph.lint()
    return torch.fx.GraphModule(root, graph), None


def _fold_constants(graph, root) -> None:
    """Compute once the nodes that depend on nothing but the graph's lifted constants (a causal mask
    made with ``ones``/``tril``/``where``, positions from ``arange``, host constants copied in): the same
    kernels on the same values give the same bits every run.  Not folded: random or mutating ops, and
    values that would reach the graph's outputs (by themselves or through views), which a caller may
    change in place."""
    values: dict = {}
    for node in graph.nodes:
        if node.op == "get_attr" and node.target.startswith("_tensor_constant"):
            values[node] = getattr(root, node.target)
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and \
                _pure(node.target) and all(a in values for a in node.all_input_nodes):
            args = torch.fx.node.map_arg(node.args, values.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, values.__getitem__)
            with torch.no_grad():
                value = node.target(*args, **kwargs)
            if isinstance(value, torch.Tensor):
                values[node] = value
    folded = [n for n in values if n.op == "call_function" and not _reaches_output(n)
              and any(u not in values for u in n.users)]
    for i, node in enumerate(folded):
        name = f"_folded_constant{i}"
        root.register_buffer(name, values[node])
        with graph.inserting_before(node):
            const = graph.get_attr(name)
        node.replace_all_uses_with(const)
    graph.eliminate_dead_code()


def _pure(op) -> bool:
    """An op whose result depends on its arguments only and which changes none of them."""
    schema = op._schema
    return (torch.Tag.nondeterministic_seeded not in op.tags and not generators.seeded(op)
            and not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
            and len(schema.returns) == 1)


def _reaches_output(node) -> bool:
    """Whether ``node``'s value, or a view of it, is an output of the graph."""
    for user in node.users:
        if user.op == "output":
            return True
        target = user.target
        if isinstance(target, torch._ops.OpOverload) and any(
                r.alias_info is not None for r in target._schema.returns) and _reaches_output(user):
            return True
    return False


def _mixed(node) -> bool:
    """Whether ``node``'s tensor operands may differ in floating dtype (their recorded dtypes, or unknown):
    else ``mixed_precision.promoted_product`` casts nothing and the op runs as it is."""
    dtypes = set()
    for a in node.all_input_nodes:
        for v in _values(a):
            if not isinstance(v, torch.Tensor):
                return True
            dtypes.add(v.dtype)
    return len(dtypes) > 1


def _host_read_if(handler) -> bool:
    """A ``special_ops._host_read_if`` handler (a host read in some calls: the recorded run shows which)."""
    return getattr(handler, "__qualname__", "").startswith("_host_read_if.")


def _values(node):
    val = node.meta.get("val")
    return val if isinstance(val, (list, tuple)) else (val,)


class GePlan:
    """A GE graph's recorded run (see the module docstring), valid for the test it was recorded in."""

    def __init__(self, graph, math, stretch: Stretch, origin, key, outputs, device: int):
        self.graph = graph
        self.math = math
        self.stretch = stretch
        self.origin = origin              # the calling stream of the recorded run
        self.key = key
        self.outputs = outputs            # per output: ("arg", i) | ("block", base) | ("value",)
        self.device = device
        # the stream of the first node an op-by-op run makes current (ge._GeRunner.execute), if any
        first = next((n for n in graph.gm.graph.nodes if n.op not in ("placeholder", "output")
                      and fxgraph.target_name(n) not in (fxgraph.SCOPE_ENTER, fxgraph.SCOPE_EXIT)), None)
        self.first_stream = None if first is None else graph.streams[graph.lane[first]]

    # ------------------------------------------------------------------- recording
    @staticmethod
    def key_of(rt, device: int, args):
        """What a run must share with the recorded one, or None when a run cannot use a plan now:
        each input's layout and which inputs share a block, and the device's core limits."""
        blocks, layout, owners = [], [], {}
        for a in args:
            if type(a) is not NpuTensor or a._graph_call is not None or a._dev != device:
                return None, None
            block = a._block
            p = a._payload
            blocks.append(block)
            layout.append((p.storage_offset(), p.shape, p.stride(), p.dtype,
                           None if block is None else owners.setdefault(id(block), len(owners))))
        d = rt.devices[device]
        layout.append((d.cube_limit, d.vector_limit))
        return tuple(layout), blocks

    @staticmethod
    def usable(rt, streams) -> bool:
        """Whether a run may be recorded or planned now (module docstring: runs that go op by op)."""
        thread = rt.thread()
        ex = rt.executor
        if thread.rank is not None or thread.site is not None or rt.routed_pools or ex.shuffle is not None:
            return False
        if torch._C._len_torch_dispatch_stack():
            return False
        return all(s.capture is None and not ex.queues.get(s.sid) for s in streams)

    @classmethod
    def build(cls, graph, math, rt, device, args, blocks, key, start, end, launch, windows, caller, outputs,
              watch=None):
        """The plan of the run recorded in ``rt.trace.log[start:end]`` (raises ``Unplannable``); ``watch``:
        the allocator watched since ``start`` (``Stretch.watch_recording``)."""
        g = graph
        if not isinstance(outputs, (list, tuple)):
            raise Unplannable("the graph's output is not a list")
        events = {e.eid: e for e in list(g.events.values()) + [g.fork] + list(g.joins.values())}
        fixed = []
        for node in g.gm.graph.nodes:
            if node.op == "get_attr":
                value = g.gm
                for part in node.target.split("."):
                    value = getattr(value, part)
                if isinstance(value, NpuTensor) and value._block is not None:
                    fixed.append(value._block)
        stretch = Stretch.record(rt, start, end, streams={s.sid: s for s in g.streams.values()}, launch=launch,
                                 events=events, inputs=blocks, fixed=fixed, windows=windows, caller=caller,
                                 watch=watch)
        held = {out._block.bid for out in outputs if isinstance(out, NpuTensor) and out._block is not None}
        if any(base not in {stretch.bases.get(bid) for bid in held} for base in stretch.live):
            raise Unplannable("a block the graph allocated outlives the run outside its outputs")
        specs = []
        for out in outputs:
            if isinstance(out, NpuTensor):
                same = next((i for i, a in enumerate(args) if a is out), None)
                if same is not None:
                    specs.append(("arg", same))
                elif out._block is None:
                    specs.append(("block", None))
                elif out._block.bid in stretch.bases:
                    specs.append(("block", stretch.bases[out._block.bid]))
                else:
                    raise Unplannable("an output holds memory from outside the graph")
            elif isinstance(out, torch.Tensor):
                raise Unplannable("an output is a host tensor")
            else:
                specs.append(("value",))
        return cls(graph, math, stretch, launch, key, (type(outputs), specs), device)

    # ------------------------------------------------------------------------- run
    def run(self, rt, args, key, blocks):
        """One run: the math on the payloads, then the recorded work appended with fresh memory."""
        with torch.no_grad():       # dispatch computes below autograd: payload results never require grad
            outs = self.math(*[a._payload for a in args])
        caller = first_user(sys._getframe(2))
        launch = rt.current_stream(self.device)
        new_blocks = self.stretch.append(rt, launch, self.origin, blocks, caller)
        if self.first_stream is not None:       # the thread's stream moves as op by op (autograd_streams)
            rt.set_current_stream(self.first_stream)
        rt.set_current_stream(launch)
        device = self.device
        container, specs = self.outputs
        result = []
        for spec, out in zip(specs, outs):
            kind = spec[0]
            if kind == "arg":
                result.append(args[spec[1]])
            elif kind == "block":
                block = None if spec[1] is None else new_blocks[spec[1]]
                if block is not None and spec[1] >= self.stretch.slot_base:
                    _remember_block(out.untyped_storage().data_ptr(), block)
                result.append(NpuTensor(out, device, block))
            else:
                result.append(out)
        return container(result)


def unplannable_reason(graph) -> str:
    """Why ``graph`` never runs a plan (its settings), or ''."""
    if graph.data_dump is not None:
        return "a data dump is configured"
    if graph.export is not None:
        return "dynamo_export is configured"
    return ""


__all__ = ["GePlan", "Unplannable", "payload_module", "unplannable_reason", "METADATA_INPLACE"]
