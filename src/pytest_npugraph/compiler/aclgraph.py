"""reduce-overhead mode (aclgraph): one NPU graph capture per graph key, replayed on later calls
(reference torchair_api.md §4; TorchAir's ``AclConcreteGraph`` + ``AclGraph``).

Per call: graph key -> capture (first time, or a recapture when a mutated input moved or the current
stream's core limit changed; ``static_capture_size_limit`` captures at most, then eager for good) ->
copy the inputs in -> replay on the current stream -> outputs at their fixed addresses.

Inputs are classified as TorchAir does: parameters/buffers (static: their addresses are part of the
key unless ``frozen_parameter``), mutated user inputs (used in place; moving them recaptures), inputs
aliased by an output (kept; copied into when they move) and user inputs (``clone_input``: copied
every call into pool buffers made at capture, freed after it so other captures may reuse them;
otherwise copied into the first call's tensor when they move).

The graph lives on the device of its inputs (``runner.device_of``): its capture stream, pool, input
buffers, replays, copies and output clones are that device's, whatever the caller's current device.

Memory-reuse modes: a custom pool (``aclgraph_config.use_custom_pool``, which also turns off reuse
within the FX graph) is shared by every graph of the config; otherwise each FX graph has its own
pool, and unless ``disable_mempool_reuse_in_same_fx`` every capture of a second or later key starts
from the pool's empty state, so live outputs of other keys go stale and their addresses are reused.
"""
from __future__ import annotations

import logging
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch._dynamo.utils import counters

from .. import trace as T
from ..runtime import graphs as _graphs
from ..runtime.callsite import caller_of_compiled, user_site
from ..runtime.runtime import current
from ..runtime.tensor import NpuTensor, note_output_reads, span
from . import aclgraph_passes as passes
from . import data_dump, deadlock_check, emit, fxgraph, reinplace, scope_stack, stream_events
from ..graph_record import GraphOp, GraphRecord
from .runner import Runner, device_of, on_device, record_node, wait_node


def _logger(settings) -> logging.Logger:
    """The product's logger (torchair's, or npugraph_ex's for that backend): its capture/recapture
    messages, which tests read."""
    return logging.getLogger("npugraph_ex" if settings.backend == "npugraph_ex" else "torchair")

_OUTPUT_WARNING = (
    "Because acl graph fixes memory addresses, acl graphs do not have a great way of handling live tensors from "
    "a previous invocation. The retained memory of acl graph output tensors will be overwritten by subsequent "
    "executions, which may cause precision issues. See "
    "https://docs.pytorch.org/docs/main/torch.compiler_cudagraph_trees.html#limitations for more details. To "
    "resolve this, you can either: 1. Remove the memory retention of all the output tensors in your script; "
    "2. Enable debug option by setting debug.aclgraph.enable_output_clone=True.")


def check_pool(pool) -> None:
    if pool is not None and not (isinstance(pool, tuple) and len(pool) == 2 and isinstance(pool[0], int)
                                 and isinstance(pool[1], int) and pool[0] * pool[1] == 0):
        raise TypeError(f"Invalid graph pool handle type, got value={pool}, type={type(pool).__name__}")


@dataclass
class GraphMeta:
    """One captured graph key."""

    key: str
    graph: Any                                   # torch_npu.npu.NPUGraph
    cube: Optional[int] = None                   # current stream's limits when captured
    vector: Optional[int] = None
    mutated_ptrs: dict = field(default_factory=dict)
    copy_in: list = field(default_factory=list)   # (input index, payload, span, data_ptr or None: always)
    retained: dict = field(default_factory=dict)  # input index -> the capture-time tensor (kept alive)
    outputs: tuple = ()                           # the capture-time outputs (static buffers)
    returned: list = field(default_factory=list)  # weak refs to the last returned outputs


class AclConcreteGraph:
    """A compiled FX graph in reduce-overhead mode; calling it runs one step as above."""

    def __init__(self, gm, settings, name: str, mutated_user_inputs, static_input_idxs, *, eager: bool = False,
                 event_tags=(), label: str = ""):
        self.settings = settings
        self.log = _logger(settings)
        self.name = name                 # TorchAir's ("graph_1": counters, dumps, event tags)
        self.label = label or name       # the reports' (graph_names: the user's function)
        self.pool_config = settings.custom_pool
        check_pool(self.pool_config)
        self.clone_input = settings.clone_input
        self.reuse_in_fx = settings.reuse_pool_in_fx        # a custom pool turns reuse within the FX graph off
        self.clone_output = settings.clone_output
        self.limit = settings.capture_limit
        self.frozen = settings.frozen_parameter
        self.eager = eager or settings.run_eagerly
        if self.frozen:
            warnings.warn("When enable frozen_parameter, Parameters and input tensors with immutable data_ptr marked "
                          "by `torch._dynamo.mark_static_address()` will be considered static. Please make sure that "
                          "the Parameters data address remain the same throughout the program runtime.")
        self._parse_inputs(gm, set(mutated_user_inputs), set(static_input_idxs))
        self.tagged_event_names: list = list(event_tags)
        self.labels: set = set()
        self.user_stream_info: dict = {}
        _, enter_labels, exit_names = passes.apply_event_closure_with_multi_stream(
            gm, name, self.tagged_event_names, self.labels, self.user_stream_info, settings.op_namespace)
        stream_events.resolve_default_stream_markers(gm)
        passes.apply_event_record(gm)
        gm.graph.eliminate_dead_code()
        emit.reinplace_verdicts(reinplace.apply(gm, settings, self.label))     # steps 7-8
        self.static_kernel = passes.replace_core_limit_nodes(gm, settings)
        if settings.data_dump_path is not None and settings.data_dump_stage == "optimized":
            if settings.super_kernel_optimize:
                warnings.warn("When super_kernel_optimize is enabled,the dump_config.enable_dump configuration "
                              "becomes invalid." if settings.backend == "torchair" else "When super_kernel_optimize "
                              "is enabled,the dump_tensor_data configuration becomes invalid.")
            else:
                data_dump.insert_saves(gm, data_dump.rank_dir(settings.data_dump_path))
        gm.recompile()
        fxgraph.stream_labels(gm)
        self.gm = gm
        self.ops = [GraphOp(n.name, str(n.target), n.meta.get("stream_label"))
                    for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
        self.runner = _AclRunner(gm, enter_labels, set(exit_names))
        self.generation = None
        self.record = None

    # ---------------------------------------------------------------- compile time
    def _parse_inputs(self, gm, mutated: set, static: set) -> None:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        metas = [n.meta.get("val") for n in placeholders]
        self.parameters, self.user_inputs, self.tensor_inputs = [], OrderedDict(), {}
        for i, (node, meta) in enumerate(zip(placeholders, metas)):
            if not isinstance(meta, torch.Tensor):
                continue
            self.tensor_inputs[i] = meta
            if (i in static or hasattr(meta, "_dynamo_static_input_type") or hasattr(meta, "_torchair_is_parameter")
                    or isinstance(meta, torch.nn.Parameter)):
                self.parameters.append(i)
            else:
                self.user_inputs.setdefault(node.target, i)
        self.mutated = {i for name, i in self.user_inputs.items() if name in mutated}
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self.ref_with_output: dict = {}
        for out_index, arg in enumerate(output.args[0]):
            meta = getattr(arg, "meta", {}).get("val") if hasattr(arg, "meta") else None
            if not isinstance(meta, torch.Tensor):
                continue
            for i, input_meta in self.tensor_inputs.items():
                if torch._C._is_alias_of(input_meta, meta):
                    self.ref_with_output.setdefault(i, []).append(out_index)
        self.key_inputs = self._key_inputs(placeholders, metas)

    @staticmethod
    def _key_inputs(placeholders, metas) -> list:
        """Sorted (index, is_symint) of the inputs whose values pick the graph key: a used symbolic
        input, or the SymInt input of a used tensor's symbolic dim (the tensor itself when it has none)."""
        sym_index = {m.node.expr: i for i, m in enumerate(metas) if isinstance(m, torch.SymInt)}
        chosen = set()
        for i, (node, meta) in enumerate(zip(placeholders, metas)):
            if not node.users:
                continue
            if isinstance(meta, torch.SymInt):
                chosen.add((i, True))
            elif isinstance(meta, torch.Tensor):
                for dim in meta.shape:
                    if isinstance(dim, torch.SymInt):
                        j = sym_index.get(dim.node.expr)
                        chosen.add((j, True) if j is not None else (i, False))
        return sorted(chosen)

    def graph_key(self, args) -> str:
        if not self.key_inputs:
            key = "no_updated_input"
        else:
            key = str([args[i] if sym else list(args[i].shape) for i, sym in self.key_inputs])
        if not self.frozen and self.parameters:
            key += str(hash(tuple(args[i].data_ptr() for i in self.parameters)))
        return key

    # -------------------------------------------------------------------- run time
    def _start_test(self, rt) -> None:
        """Fresh per-test state: a compiled graph can outlive the test that compiled it."""
        self.generation = rt.generation
        self.metas: dict = {}
        self.captured = False
        self.fallback = False
        self.stream = None
        self.pool = None
        self.warned = False
        self.record = GraphRecord(self.name, self.settings.mode, self.ops, fx_graph=self.gm, label=self.label)
        rt.graphs.append(self.record)
        # what the generated module makes on its first run: TorchAir's events and the labels' streams
        passes.create_events(self.tagged_event_names)
        self.runner.label_streams = {label: self._label_stream(label) for label in sorted(self.labels)}

    def _label_stream(self, label):
        """A stream scope's stream: the user's own stream (native streams), else a new one per label."""
        info = self.user_stream_info.get(label)
        if info is None:
            stream = torch.npu.Stream()
            current().name_stream(stream._state, f"{self.label}:tag '{label}'")   # as GE names its tag streams
            return stream
        return torch.npu.Stream(stream_id=info["stream_id"], device_index=info["device_index"],
                                device_type=info["device_type"])

    def __call__(self, *args):
        rt = current()
        device = device_of(args, rt)
        with on_device(device, rt):      # the graph's streams, pool, capture and copies are its device's
            return self._call(rt, args)

    def _call(self, rt, args):
        """One call, on the graph's device (Dynamo compiles a graph per input device)."""
        if self.generation != rt.generation:
            self._start_test(rt)
        self.record.runs += 1
        if self.eager:
            return self.runner.run(*args)
        key = self.compile(rt, args)
        if self.fallback:
            return self.runner.run(*args)
        meta = self.metas[key]
        note_output_reads(rt, [a for a in args if isinstance(a, NpuTensor)], caller_of_compiled())
        self.process_input(rt, meta, args)
        meta.graph.replay()
        self.record.replays += 1
        return self.reconstruct_outputs(rt, meta)

    def compile(self, rt, args) -> str:
        if not self.captured:
            self.stream = torch.npu.Stream()
            rt.name_stream(self.stream._state, f"{self.label}:capture")    # where its captures allocate
            self.pool = self.pool_config if self.pool_config is not None else torch.npu.graph_pool_handle()
            with torch.npu.graph(torch.npu.NPUGraph(), pool=self.pool, stream=self.stream):
                pass    # TorchAir initialises the pool with an empty capture
            self.captured = True
        if self.fallback:
            return "fallback_to_eager"
        key = self.graph_key(args)
        if key in self.metas:
            self.log.info("Find captured AclGraph{id: %s} of fx_graph %s with graph key {%s}.",
                     id(self.metas[key].graph), self.name, key)
            if not self._needs_recapture(key, args):
                self.log.debug("The current AclGraph no needs to be recaptured for fx_graph %s with graph key {%s}.",
                          self.name, key)
                return key
            self.log.debug("The current AclGraph needs to be recaptured for fx_graph %s with graph key {%s}.",
                      self.name, key)
        recapture = key in self.metas
        if len(self.metas) == self.limit:
            self._fall_back(key)
            return "fallback_to_eager"
        old = self.metas.get(key)
        self._capture(rt, key, args)
        self._log_capture_counts()
        if recapture:
            self.record.recaptures += 1
            old.graph.reset()
        return key

    def _log_capture_counts(self) -> None:
        """TorchAir's DEBUG line after each capture: captures and recaptures by cause (npugraph_ex's also
        counts those force_recapture made)."""
        count = counters["npugraph_ex"]
        line = (f"For graph {self.name} : the count of captures is {count['captured_' + self.name]}, and count of "
                f"recaptures caused by mutated inputs changed is "
                f"{count['recapture_due_to_mutated_input_change_' + self.name]}, and count of recaptures caused by "
                f"global limit changed is {count['recapture_due_to_global_limit_core_change_' + self.name]}")
        if self.settings.backend == "npugraph_ex":
            line += (f", and count of recaptures caused by force_recapture is "
                     f"{count['recapture_due_to_force_recapture_' + self.name]}")
        self.log.debug(line)

    def _needs_recapture(self, key, args) -> bool:
        if self.settings.force_recapture:        # npugraph_ex's option: every run captures anew
            counters["npugraph_ex"]["recapture_due_to_force_recapture_" + self.name] += 1
            return True
        meta = self.metas[key]
        for i, ptr in meta.mutated_ptrs.items():
            if args[i].data_ptr() != ptr:
                counters["npugraph_ex"]["recapture_due_to_mutated_input_change_" + self.name] += 1
                return True
        limits = torch.npu.get_stream_limit(torch.npu.current_stream())
        if (limits["cube_core_num"], limits["vector_core_num"]) != (meta.cube, meta.vector):
            counters["npugraph_ex"]["recapture_due_to_global_limit_core_change_" + self.name] += 1
            return True
        return False

    def _fall_back(self, key) -> None:
        msg = (f"The static_capture_size_limit reached when capturing fx_graph {self.name} with graph key {key}, we "
               f"will fall back to eager for all subsequent executions. Excessive recapture can degrade performance "
               f"due to the each recapture overhead, and result in unexpected resources consumption, including "
               f"stream, memory, etc. This may lead to program error: The resources are insufficient. The current "
               f"static_capture_size_limit is {self.limit}. If recapture are expected, consider increasing "
               f"debug.aclgraph.static_capture_size_limit to an appropriate value.")
        warnings.warn(msg)
        self.fallback = True
        torch.npu.synchronize()
        for name in ("captured_", "recapture_due_to_mutated_input_change_", "recapture_due_to_global_limit_core_change_",
                     "recapture_due_to_force_recapture_"):
            counters["npugraph_ex"].pop(name + self.name, None)
        for meta in self.metas.values():
            meta.graph.reset()
        self.metas = {}
        self.record.captures = 0
        self.record.fallback_to_eager = True
        torch.npu.empty_cache()

    def _capture(self, rt, key, args) -> None:
        first_seq = len(rt.trace)
        if self.reuse_in_fx and len(set(self.metas) | {key}) > 1:
            # start from the pool's original (empty) state: outputs of other keys go stale
            _graphs.reset_pool(rt, self.stream.device_index, self.pool)
        meta = self.metas[key] = GraphMeta(key, torch.npu.NPUGraph())
        self.log.debug("No find captured AclGraph{id: %s} of fx_graph %s with graph key {%s}, and start to capture it.",
                  id(meta.graph), self.name, key)
        counters["npugraph_ex"]["captured_" + self.name] = len(self.metas)
        self.record.captures = len(self.metas)
        if key not in self.record.keys:
            self.record.keys.append(key)
        meta.mutated_ptrs = {i: args[i].data_ptr() for i in self.mutated}
        limits = torch.npu.get_stream_limit(torch.npu.current_stream())
        meta.cube, meta.vector = limits["cube_core_num"], limits["vector_core_num"]
        with current().restored_limits():     # the capture stream takes the caller's limits (none: none)
            torch.npu.set_stream_limit(self.stream, meta.cube, meta.vector)
        meta.graph._graph_id = T.GraphCall(self.label, key)
        inputs = list(args)
        with torch.npu.graph(meta.graph, pool=self.pool, stream=self.stream):
            for i in self.user_inputs.values():
                if i in self.mutated or not isinstance(inputs[i], torch.Tensor):
                    continue
                cloned = i not in self.ref_with_output and self.clone_input and inputs[i].is_npu
                if cloned:
                    buffer = torch.empty_like(inputs[i], memory_format=torch.contiguous_format)
                    buffer._payload.copy_(inputs[i]._payload)   # so the capture computes on the real values
                    inputs[i] = buffer
                else:
                    meta.retained[i] = inputs[i]
                t = inputs[i]
                meta.copy_in.append((i, getattr(t, "_payload", t), span(t) if isinstance(t, NpuTensor) else None,
                                     None if cloned else t.data_ptr()))
            outputs = self.runner.run(*inputs)
        meta.outputs = tuple(outputs)
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("After capturing fx_graph %s for graph key{%s} to AclGraph{id: %s}, memory pool reuse is %s, "
                      "the memory state is {%s}.", self.name, key, id(meta.graph),
                      "enable" if self.reuse_in_fx else "disable", _pool_state())
        if self.settings.deadlock_check:
            deadlock_check.report(rt.trace, first_seq, len(rt.trace))
        if self.settings.super_kernel_optimize:
            meta.graph.super_kernel_optimize(optimize_options=self.settings.super_kernel_optimize_options,
                                             debug_options=self.settings.super_kernel_debug_options)

    def process_input(self, rt, meta, args) -> None:
        """Copy this call's inputs into the memory the graph reads: every call into the cloned-input
        buffers, otherwise only inputs that moved (one copy task on the current stream)."""
        reads, writes = [], []
        for i, payload, dst, ptr in meta.copy_in:
            src = args[i]
            if ptr is not None and src.data_ptr() == ptr:
                continue
            src_payload = getattr(src, "_payload", src)
            if src_payload is payload:
                continue
            payload.copy_(src_payload)
            if isinstance(src, NpuTensor) and span(src) is not None:
                reads.append(span(src))
            if dst is not None:
                writes.append(dst)
        if writes:
            emit.copy_inputs(rt, rt.current_stream(), reads, writes, user_site(2))

    def reconstruct_outputs(self, rt, meta) -> list:
        """This call's outputs: handles onto the static output buffers (cloned with
        ``enable_output_clone``, except outputs aliasing an input)."""
        outputs = [NpuTensor(t._payload, t.device.index, t._block) if isinstance(t, NpuTensor) else t
                   for t in meta.outputs]
        if self.reuse_in_fx and len(self.metas) > 1 and not self.clone_output and not self.warned:
            if not all(ref() is not None for ref in meta.returned):
                warnings.warn(_OUTPUT_WARNING)
                self.warned = True
        meta.returned = [weakref.ref(t) for t in outputs if isinstance(t, torch.Tensor)]
        aliased = {j for outs in self.ref_with_output.values() for j in outs}
        if self.clone_output:
            outputs = [t.clone() if isinstance(t, torch.Tensor) and j not in aliased else t
                       for j, t in enumerate(outputs)]
        else:   # this call's handles onto the static buffers (not outputs that are the user's inputs)
            call = T.GraphCall(self.label, meta.key, self.record.replays)
            for j, t in enumerate(outputs):
                if isinstance(t, NpuTensor) and j not in aliased:
                    t._graph_call = call
        emit.graph_outputs(rt, rt.current_stream(), self.label, meta.key, self.record.replays,
                           tuple(s for s in (span(t) for t in outputs if isinstance(t, NpuTensor)) if s is not None),
                           caller_of_compiled())   # an empty output has no memory to overwrite
        return outputs


class _AclRunner(Runner):
    """The generated ``forward`` of TorchAir's codegen: stream scopes run inside
    ``with torch.npu.stream(<label's stream>)`` blocks, ``air.record``/``air.wait`` become events."""

    def __init__(self, gm, enter_labels: dict, exits: set):
        super().__init__(gm)
        self.enter_labels = enter_labels
        self.exits = exits
        self.label_streams: dict = {}

    def begin(self, rt, args) -> None:
        self.saved = [torch.npu.current_stream()]
        self.scope_depth = scope_stack.depth()

    def end(self, rt) -> None:
        """Back to the calling stream and scope stack, also when a node raised."""
        torch.npu.set_stream(self.saved[0])
        scope_stack.unwind(self.scope_depth)

    def execute(self, rt, node, args, kwargs):
        name = fxgraph.target_name(node)
        if name == "air.record.default":
            return record_node(rt)
        if name == "air.wait.default":
            return wait_node(args[0])
        result = self.call(node, args, kwargs)
        label = self.enter_labels.get(node.name)
        if label is not None:
            self.saved.append(torch.npu.current_stream())
            torch.npu.set_stream(self.label_streams[label])
        elif node.name in self.exits:
            torch.npu.set_stream(self.saved.pop())
        return result


def _pool_state() -> str:
    """TorchAir's ``debug_mem_state``: one line per segment of a graph pool (``memory_snapshot``), with
    its active block count, as its capture log shows it (tests read ``'activate_num': N`` there)."""
    lines = []
    for segment in torch.npu.memory_snapshot():
        if segment.get("segment_pool_id", (0, 0)) == (0, 0):
            continue
        lines.append(str(({"device": segment["device"]}, {"stream": segment["stream"]},
                          {"pool_id": segment["segment_pool_id"]}, {"block_num": len(segment["blocks"])},
                          {"activate_num": sum(int(b["state"] == "active_allocated") for b in segment["blocks"])},
                          {"total_size": segment["total_size"]}, {"allocated_size": segment["allocated_size"]})))
    return "\n" + "\n".join(lines)
