"""``get_npu_backend`` / ``get_compiler`` / ``compile_fx`` of npugraph_ex (mirrors
``npu_fx_compiler.py``); the compilation itself is ``pytest_npugraph.compiler.pipeline``, in the
aclgraph mode with npugraph_ex's passes (``replace_stream_event_pass``, the per-stream event closure,
the event-aware reinplace checker).  The config is read into the compiler's frozen ``Settings`` when
the backend is made; ``options={...}`` go to a copy, so a user's config is never changed."""
from __future__ import annotations

__all__ = ["get_npu_backend", "get_compiler", "compile_fx"]

import copy
import functools
from typing import Dict, List

import torch

from npugraph_ex._utils.error_code import pretty_error_msg
from npugraph_ex.configs.compiler_config import CompilerConfig, _process_kwargs_options


def _settings(config: CompilerConfig):
    import npugraph_ex.ops  # noqa: F401  (the npugraph_ex:: ops the passes insert)
    import npugraph_ex.scope  # noqa: F401
    from pytest_npugraph.compiler.settings import settings_from_config
    from torch_npu.npu.utils import _is_gte_cann_version

    return settings_from_config(config, backend="npugraph_ex", cann_ge_9=_is_gte_cann_version("9.0.0", module="CANN"))


class _NpuFxCompiler:
    """Compiles one FX graph (called by AOTAutograd for each graph)."""

    def __init__(self, compiler_config: CompilerConfig) -> None:
        self.config = compiler_config
        self.settings = _settings(compiler_config)

    @pretty_error_msg
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor]):
        from pytest_npugraph.compiler.pipeline import NpuFxCompiler

        return NpuFxCompiler(self.settings)(gm, example_inputs)


def get_compiler(compiler_config: CompilerConfig = None):
    return _NpuFxCompiler(CompilerConfig() if compiler_config is None else compiler_config)


def compile_fx(gm, example_inputs=None, options=None):
    """Compile an (AOT) FX graph with ``options`` applied to a fresh config."""
    config = CompilerConfig()
    _process_kwargs_options(config, {"options": {} if options is None else options})
    return get_compiler(config)(gm, example_inputs)


def _npu_backend(gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor], compiler_config: CompilerConfig = None,
                 decompositions: Dict = {}, settings=None, **kwargs):  # noqa: B006  (as npugraph_ex's signature)
    from pytest_npugraph.compiler.pipeline import compile_graph

    if compiler_config is None:
        compiler_config = CompilerConfig()
    if "options" in kwargs or settings is None:
        compiler_config = copy.deepcopy(compiler_config)
        _process_kwargs_options(compiler_config, kwargs)
        settings = _settings(compiler_config)
    return compile_graph(gm, example_inputs, settings, decompositions, wrap_errors=pretty_error_msg)


def get_npu_backend(*, compiler_config: CompilerConfig = None, custom_decompositions: Dict = {}):  # noqa: B006
    """The backend for ``torch.compile(model, backend=npugraph_ex.get_npu_backend(compiler_config=config))``."""
    if compiler_config is None:
        compiler_config = CompilerConfig()
    return functools.partial(_npu_backend, compiler_config=compiler_config, decompositions=dict({} if custom_decompositions is None else custom_decompositions),
                             settings=_settings(compiler_config))
