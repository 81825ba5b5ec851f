"""Emulated ``torchair`` (pytest-npugraph): the TorchAir graph-mode surface over the emulated device.

``torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config))`` runs on the CPU
with GE mode (``max-autotune``, default) or reduce-overhead (aclgraph) semantics; ``torchair.scope``
and ``torchair.ops`` trace into the graph as in the real package."""
__all__ = ["get_compiler", "get_npu_backend", "dynamo_export", "CompilerConfig", "use_internal_format_weight",
           "logger", "register_fx_node_ge_converter", "patch_for_hcom", "register_replacement",
           "npu_format_cast_via_cpu"]

import torch_npu  # noqa: F401  (the npu device: torchair needs torch_npu)

from torchair.npu_fx_compiler import get_compiler, get_npu_backend
from torchair.configs.compiler_config import CompilerConfig
from torchair.experimental.inference import npu_format_cast_via_cpu, use_internal_format_weight
from torchair.core.utils import logger
from torchair.npu_export import dynamo_export
from torchair._ge_concrete_graph.fx2ge_converter import register_fx_node_ge_converter

import torchair._acl_concrete_graph.replace_stream_event  # noqa: E402,F401
import torchair.inference  # noqa: E402,F401
import torchair.ops  # noqa: E402,F401
import torchair.scope  # noqa: E402,F401

__version__ = "0.1.0+pytest-npugraph"


def patch_for_hcom():
    logger.warning("For versions 2.3.1 and above of PyTorch, there is no need to call patch_for_hcom anymore.")


def register_replacement(*args, **kwargs):
    """Pattern replacement passes are accepted and not applied (they only fuse ops)."""
    return None
