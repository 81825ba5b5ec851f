"""Emulated ``npugraph_ex`` (pytest-npugraph): the aclgraph backend TorchAir recommends, as torch_npu
bundles it (``torch_npu.dynamo.npugraph_ex``; ``torch.compile(model, backend="npugraph_ex",
options={...})``; ``torch.npu.npugraph_ex``).  Graphs are captured once per graph key and replayed
on the emulated device; native ``torch.npu.Stream``/``Event`` code inside the compiled region becomes
stream scopes and tagged events as in the real package."""
__all__ = ["get_npu_backend", "get_compiler", "compile_fx", "CompilerConfig", "logger", "register_replacement"]

from npugraph_ex.npu_fx_compiler import compile_fx, get_compiler, get_npu_backend
from npugraph_ex.configs.compiler_config import CompilerConfig
from npugraph_ex.core.utils import logger
import npugraph_ex.inference  # noqa: F401
import npugraph_ex.ops  # noqa: F401
import npugraph_ex.scope  # noqa: F401


def register_replacement(search_fn, replace_fn, example_inputs, trace_fn=None, extra_check=None,
                         search_fn_pattern=None, scalar_workaround=None, skip_duplicates=False):
    """Pattern replacements only fuse ops: accepted and not applied by the emulator."""
    return None


def _backend(gm, example_inputs, **kwargs):
    """What ``backend="npugraph_ex"`` calls (torch_npu's ``_exec``): a fresh config per compile."""
    config = CompilerConfig()
    config.mode = "npugraph_ex"
    return get_npu_backend(compiler_config=config)(gm, example_inputs, **kwargs)
