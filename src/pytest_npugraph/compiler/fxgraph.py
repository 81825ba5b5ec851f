"""What the compiler reads from an FX graph: scope attributes per node, the user's source line of a
node, mutated inputs, and TorchAir's scope-pairing check (``_valid_graph``) with its messages."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ..runtime import callsite
from ..trace import Site

SCOPE_ENTER = "air.scope_enter.default"
SCOPE_EXIT = "air.scope_exit.default"
SK_BEGIN = "npu.super_kernel_scope_begin.default"
SK_END = "npu.super_kernel_scope_end.default"
STREAM_LABEL = "_user_stream_label"
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def target_name(node) -> str:
    """The node's op name, with npugraph_ex's ops under TorchAir's ``air`` names (same schemas and
    kernels: ``npugraph_ex.scope_enter.default`` reads as ``air.scope_enter.default``)."""
    name = str(node.target)
    return "air." + name[len("npugraph_ex."):] if name.startswith("npugraph_ex.") else name


def node_site(node) -> Optional[Site]:
    """The innermost user frame of the node's ``stack_trace`` (where the op is in the model code)."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    for path, line, func in reversed(_FRAME.findall(trace)):
        shown = callsite._display(path)
        if shown is not None:
            return Site(shown, int(line), func)
    return None


@dataclass(frozen=True)
class Scope:
    """The torchair scope attributes in force at a node (innermost wins, as ``ScopeAttrs.apply``)."""

    stream: Optional[str] = None        # _user_stream_label of the innermost stream scope
    aicore: Optional[int] = None        # limit_core_num
    vectorcore: Optional[int] = None
    super_kernel: Optional[str] = None  # None outside any (or inside super_kernel(None))
    super_kernel_options: str = ""      # its options ("stream-fusion=1:...")
    super_kernel_site: Optional[Site] = field(default=None, compare=False)   # the line of its ``with``


def _merge(stack) -> Scope:
    """``stack``: (attributes, enter node) per open scope, outermost first."""
    attrs: dict = {}
    opened = None
    for frame, enter in stack:
        for key, value in frame.items():
            if key == "_super_kernel_scope" and value == "":
                attrs.pop("_super_kernel_scope", None)
                attrs.pop("_super_kernel_options", None)
                opened = None
                break
            if key == "_super_kernel_scope":
                opened = enter
            attrs[key] = value
    core = attrs.get("_op_aicore_num"), attrs.get("_op_vectorcore_num")
    return Scope(attrs.get(STREAM_LABEL), None if core[0] is None else int(core[0]),
                 None if core[1] is None else int(core[1]), attrs.get("_super_kernel_scope"),
                 attrs.get("_super_kernel_options", ""), None if opened is None else node_site(opened))


def scopes(gm) -> dict:
    """node -> Scope, walking ``air.scope_enter``/``scope_exit`` in graph order (an enter/exit node
    gets the scope in force once it has run)."""
    stack, result, current = [], {}, Scope()
    for node in gm.graph.nodes:
        name = target_name(node)
        if name == SCOPE_ENTER:
            stack.append((dict(zip(node.args[0], node.args[1])), node))
            current = _merge(stack)
        elif name == SCOPE_EXIT and stack:
            result[node] = current
            stack.pop()
            current = _merge(stack)
            continue
        result[node] = current
    return result


def stream_labels(gm) -> None:
    """Set ``node.meta["stream_label"]`` as TorchAir's ``add_stream_label_to_node_meta`` does: the
    innermost enclosing stream scope's label (``args[1][0]``), None on the capture stream."""
    saved, label = [], None
    for node in gm.graph.nodes:
        name = target_name(node)
        if name == SCOPE_ENTER:
            saved.append(label)
            if len(node.args) > 0 and STREAM_LABEL in node.args[0]:
                label = node.args[1][0] if len(node.args) > 1 else None
        elif name == SCOPE_EXIT:
            node.meta["stream_label"] = label
            if saved:
                label = saved.pop()
            continue
        node.meta["stream_label"] = label


def is_inplace(node) -> bool:
    if isinstance(node.target, str):
        return node.target.endswith("_")
    packet = getattr(node.target, "overloadpacket", None)
    return bool(packet is not None and getattr(packet, "__name__", "").endswith("_"))


def mutated_user_inputs(gm) -> list:
    """Placeholder names that an in-place node (``copy_`` epilogues included) writes as ``args[0]``."""
    placeholders = {n.target for n in gm.graph.nodes if n.op == "placeholder"}
    mutated = [n.args[0].name for n in gm.graph.nodes
               if n.op != "placeholder" and is_inplace(n) and n.args and hasattr(n.args[0], "name")]
    return [name for name in mutated if name in placeholders]


_HINT = ("Please check your code or your post_grad_custom_pre_pass post_grad_custom_post_pass!"
         "This error may also occur in a Dynamo graph break scenario.")


def valid_graph(gm) -> None:
    """Scopes must be paired (``air`` enter/exit by nesting, SuperKernel begin/end by scope name)."""
    open_scopes, open_sk = [], []
    for node in gm.graph.nodes:
        name = target_name(node)
        if name == SCOPE_ENTER:
            open_scopes.append(node)
        elif name == SCOPE_EXIT:
            if not open_scopes:
                raise RuntimeError(
                    f"When you call the torch.ops.air.scope_exit operator: {node.name}, you must first call the "
                    f"torch.ops.air.scope_enter operator, as they must be called in pairs. {_HINT}")
            open_scopes.pop()
        elif name == SK_BEGIN:
            open_sk.append(node)
        elif name == SK_END:
            if not open_sk:
                raise RuntimeError(
                    f"When you call the torch.npu.super_kernel_scope_end operator: {node.name}, you must first call "
                    f"the torch.npu.super_kernel_scope_begin, as they must be called in pairs. {_HINT}")
            scope = node.args[0] if node.args else None
            names = [n.args[0] if n.args else None for n in open_sk]
            if scope not in names:
                raise RuntimeError(
                    f"No matching torch.npu.super_kernel_scope_begin found for torch.npu.super_kernel_scope_end "
                    f"operator '{node.name}' with scope_name='{scope}'. Available unmatched scope_names are: "
                    f"{names}. Please ensure that each super_kernel_scope_end has a corresponding "
                    f"super_kernel_scope_begin with the same scope_name parameter.")
            open_sk.pop(names.index(scope))
    if open_scopes:
        raise RuntimeError(
            f"After you call the torch.ops.air.scope_enter operator, there is no paired call to the "
            f"torch.ops.air.scope_exit operator. The parameters for these torch.ops.air.scope_enter calls are:"
            f"{[n.args for n in open_scopes]}. {_HINT}")
    if open_sk:
        raise RuntimeError(
            f"After you call the torch.npu.super_kernel_scope_begin operator, there is no paired call to the "
            f"torch.npu.super_kernel_scope_end operator. The parameters for these "
            f"torch.npu.super_kernel_scope_begin calls are:{[n.args[0] if n.args else None for n in open_sk]}. "
            f"{_HINT}")
