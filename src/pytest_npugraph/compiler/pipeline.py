"""From the Dynamo graph to a mode's runnable graph, in TorchAir's order (reference §4.1):
AOTAutograd (input mutations kept in the graph as ``copy_`` epilogues), mutated-input detection, the
common FX passes (custom pre pass, no-op removal, pattern fusion, view -> reshape, custom post pass), the scope
pairing check, then GE mode or reduce-overhead."""
from __future__ import annotations

import copy
import itertools
import logging

import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch.utils._mode_utils import no_dispatch

from . import data_dump, fusion, fxgraph, graph_dump, noop_ops, stream_events
from ..runtime import graph_names
from ..runtime.runtime import current
from .aclgraph import AclConcreteGraph
from .ge import GeGraph
from .runner import Runner
from .settings import ACLGRAPH_MODES

log = logging.getLogger("torchair")


def next_graph_name() -> str:
    """"graph_<n>", numbered from 1 in each test (TorchAir's _GLOBAL_GRAPH_ID counts per process, and
    every test is a fresh machine); the first compile of a test also clears TorchAir's counters."""
    from torch._dynamo.utils import counters

    extensions = current().extensions
    if "torchair.graph_ids" not in extensions:
        extensions["torchair.graph_ids"] = itertools.count(1)
        counters["npugraph_ex"].clear()
    return f"graph_{next(extensions['torchair.graph_ids'])}"


def optimize_fx(gm, settings, example_inputs):
    pre = settings.pre_pass
    if pre is not None:
        pre(gm, example_inputs, settings.config)
    if settings.remove_noop_ops:
        noop_ops.remove_noop_ops(gm.graph)
    if settings.pattern_fusion:
        fusion.apply(gm)
    for node in gm.graph.nodes:
        if node.target == torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    post = settings.post_pass
    if post is not None:
        post(gm, example_inputs, settings.config)
    gm.graph.lint()
    gm.recompile()
    return gm


def _dump(settings, gm, stem: str, name: str, lanes=None) -> None:
    if settings.graph_dump is None:
        return
    kind = settings.graph_dump_type
    if settings.aclgraph and kind != "py":
        raise NotImplementedError(f"Graph dump for aclGraph only support 'py' type, but got: {kind}.Please check "
                                  f"compile config setting: config.debug.graph_dump.type")
    graph_dump.write(settings.graph_dump(stem), gm, kind, name, lanes)


class NpuFxCompiler:
    """Compiles one AOT graph (forward, inference or backward) for the config's mode."""

    def __init__(self, settings, phase: str = "forward", function=None):
        self.settings = settings
        self.phase = phase
        self.function = function       # the user's function Dynamo compiled (graph_names), None: find it
        self.static_input_idxs: list = []
        self.event_tags: list = []     # events replace_stream_event_pass registered for this Dynamo graph

    def __call__(self, gm, example_inputs):
        settings = self.settings
        mode = settings.mode
        if mode not in ("max-autotune",) + ACLGRAPH_MODES:
            raise ValueError(f"Unsupported npu backend mode: {mode}.")
        with no_dispatch():     # as TorchAir: constants (torch.tensor in the region) copy as real tensors
            gm = copy.deepcopy(gm)
        mutated = fxgraph.mutated_user_inputs(gm)
        log.debug("find mutated user inputs: %s", mutated)
        name = next_graph_name()
        label = graph_names.compiled(current(), self.function or graph_names.compiled_function(gm), name)
        gm = (settings.optimize or optimize_fx)(gm, settings, example_inputs)
        fxgraph.valid_graph(gm)
        original = f"dynamo_original_graph_{name.split('_')[1]}"
        if mode == "max-autotune":
            if settings.run_eagerly:
                _dump(settings, gm, original, name)
                log.warning("When debug.run_eagerly=True is enabled, the graph FALLS BACK to EAGER execution. Once "
                            "running finished, please make sure to disable the debug.run_eagerly=True config to "
                            "ensure that the graph is compiled and executed.")
                return Runner(gm).run
            graph = GeGraph(gm, settings, name, label)
            _dump(settings, gm, original, name, graph.lane)
            return graph
        _dump(settings, gm, original, name)
        if settings.data_dump_path is not None and settings.data_dump_stage == "original":
            # TorchAir returns the AOT graph with the saves inserted: it runs eagerly
            return Runner(data_dump.insert_saves(gm, data_dump.rank_dir(settings.data_dump_path))).run
        # the backward graph too is captured and replayed, as TorchAir compiles it with the same compiler
        graph = AclConcreteGraph(gm, settings, name, mutated, self.static_input_idxs, event_tags=self.event_tags,
                                 label=label)
        _dump(settings, graph.gm, f"dynamo_optimized_{name}", name)
        return graph


def _static_input_idxs(num_dynamo_inputs: int, num_aot_inputs: int) -> list:
    """Parameters/buffers (and ``mark_static_address`` tensors) among the AOT graph's inputs: what
    AOTAutograd's metadata says (``static_input_indices``), else the leading inputs it lifted, as
    Inductor's ``get_static_input_idxs`` reads them (TorchAir calls it; its module, compile_fx, would
    import all of Inductor)."""
    from torch._inductor.utils import num_fw_fixed_arguments     # loaded with Dynamo

    context = torch._guards.TracingContext.try_get()
    if context is None or not context.fw_metadata:
        return list(range(num_fw_fixed_arguments(num_dynamo_inputs, num_aot_inputs)))
    return list(context.fw_metadata.static_input_indices)


def _unchanged(fn):
    return fn


def compile_graph(gm, example_inputs, settings, decompositions=None, wrap_errors=_unchanged):
    """What TorchAir's backend does with a Dynamo graph (``_compile_graph_with_aot``).  ``wrap_errors``
    re-raises a compile error the way the calling package does (torchair's ``pretty_error_msg``)."""
    pretty_error_msg = wrap_errors
    num_inputs = len(example_inputs)
    function = graph_names.compiled_function(gm)    # Dynamo is compiling it now; backward compiles later
    forward = NpuFxCompiler(settings, function=function)
    backward = NpuFxCompiler(settings, "backward", function=function)
    if settings.aclgraph:
        tags: list = []
        gm = stream_events.replace_stream_event_pass(gm, settings.op_namespace,
                                                     stream_events.next_graph_id(current()), tags)
        forward.event_tags = backward.event_tags = tags

    @pretty_error_msg      # as TorchAir's compiler: same exception type, traceback and error code appended
    def fw_compiler(fw_gm, fw_inputs):
        forward.static_input_idxs = _static_input_idxs(num_inputs, len(fw_inputs))
        return forward(fw_gm, fw_inputs)

    return aot_module_simplified(
        gm, example_inputs, fw_compiler=fw_compiler, bw_compiler=pretty_error_msg(backward),
        inference_compiler=fw_compiler, decompositions=decompositions or {},
        keep_inference_input_mutations=settings.keep_inference_input_mutations)
