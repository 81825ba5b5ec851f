"""The compile options a GE graph is loaded with, logged on the ``torchair`` logger when the graph first
runs, as TorchAir's ``GeConcreteGraph`` does before ``graph.load`` (its ``_normalize_ge_option``):
users and TorchAir's own tests read these lines to see whether GE writes an output into the memory
of the input it updates.

The option that matters is ``ge.exec.outputReuseInputMemIndexes``: an input the graph updates
(AOTAutograd's ``copy_`` epilogue into a placeholder, which TorchAir converts to an ``Assign`` on the
graph's ``Data``) is written through a graph output that reuses the input's memory.  The output is
the one that already returns the written value, else one appended after the user's outputs.  Inputs
are numbered as GE's ``Data`` ops after unused ones are removed.  When a pair's input lives on the
host (a CPU tensor), TorchAir leaves the option out and logs why.  Options whose values come from
GE itself (the deterministic level of the device, dynamic gears) are not written."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("torchair")

_COPY = "aten.copy_.default"


def _outputs(gm) -> list:
    """The FX output values GE returns (tensors and symbols; constants and None are not GE outputs)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = torch.fx.node.map_arg(out.args[0], lambda n: n)
    values = flat if isinstance(flat, (list, tuple)) else [flat]
    return [v for v in values if isinstance(v, torch.fx.Node)]


def data_inputs(gm) -> list:
    """The placeholders that become GE ``Data`` ops, in GE's index order (unused ones removed)."""
    return [n for n in gm.graph.nodes if n.op == "placeholder" and n.users]


def output_ref_input(gm) -> tuple:
    """({GE output index: GE input index} of the outputs that write an updated input, GE's output count)."""
    from .fxgraph import target_name

    data = {node: index for index, node in enumerate(data_inputs(gm))}
    outputs = _outputs(gm)
    count = len(outputs)
    mapping = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or target_name(node) != _COPY or node.args[0] not in data:
            continue
        value = node.args[1]
        reused = [i for i, out in enumerate(outputs) if out is value or out is node]
        if not reused:
            reused, count = [count], count + 1
        for index in reused:
            mapping[index] = data[node.args[0]]
    return mapping, count


def _on_host(node) -> bool:
    value = node.meta.get("val")
    return not isinstance(value, torch.Tensor) or value.device.type == "cpu"


def _reuse_on_host(mapping: dict, data: list) -> bool:
    for output, index in mapping.items():
        if _on_host(data[index]):
            log.info("Skip outputReuseInputMemIndexes: reuse pair (output=%s, input=%s) uses host input.",
                     output, index)
            return True
    return False


def _has_empty_tensor(gm) -> bool:
    """Whether an op of the graph makes only zero-element tensors (GE then may not assume none is empty)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        value = node.meta.get("val")
        flat = [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, torch.Tensor)]
        if flat and all(statically_known_true(v.numel() == 0) for v in flat):   # unbacked sizes: not known empty
            return True
    return False


def log_compile_options(gm, settings, args) -> dict:
    """Log the (global, then local) options of the graph's first load as TorchAir does; the local ones."""
    local, glob = (dict(items) for items in settings.ge_options)
    glob["ge.exec.staticMemoryPolicy"] = "2"
    glob["ge.opSelectImplmode"] = "high_precision"
    log.info("global compile options:")
    for key, value in glob.items():
        log.info(f"  {key}: {value}")
    data = data_inputs(gm)
    mapping, count = output_ref_input(gm)
    reuse = [i for i in range(count) if i not in mapping]
    if reuse:
        local["ge.exec.outputReuseMemIndexes"] = ",".join(str(i) for i in reuse)
    if mapping and not _reuse_on_host(mapping, data):
        local["ge.exec.outputReuseInputMemIndexes"] = "|".join(f"{i},{o}" for o, i in mapping.items())
    local["ge.deterministic"] = "1" if torch.are_deterministic_algorithms_enabled() else "0"
    local["ge.exec.atomicCleanPolicy"] = "1"
    position = {node: i for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    values = [args[position[node]] if position[node] < len(args) else None for node in data]
    if data:
        local["frozenInput"] = ",".join(
            "1" if settings.frozen_parameter and isinstance(v, torch.nn.Parameter) and not _on_host(node) else "0"
            for node, v in zip(data, values))
    local["ge.exec.allTensorNotEmpty"] = "0" if _has_empty_tensor(gm) else "1"
    hint = ";".join(f"{i}:{list(v.shape) if isinstance(v, torch.Tensor) else []}" for i, v in enumerate(values))
    log.info("Append ge.inputHintShape: %s to local compile options.", hint)
    local["ge.inputHintShape"] = hint
    log.info("local compile options:")
    for key, value in local.items():
        log.info(f"  {key}: {value}")
    return local
