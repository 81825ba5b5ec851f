"""``get_npu_backend`` / ``get_compiler`` / ``compile_fx`` of npugraph_ex (mirrors
``npu_fx_compiler.py``): torchair's backend (``torchair.npu_fx_compiler``) with npugraph_ex's flavor:
its flat ``CompilerConfig``, its ``options={...}`` check, the aclgraph mode with npugraph_ex's passes
(``replace_stream_event_pass``, the per-stream event closure, the event-aware reinplace checker)."""
from __future__ import annotations

__all__ = ["get_npu_backend", "get_compiler", "compile_fx"]

from typing import Dict

from torchair.npu_fx_compiler import _backend, _Flavor, _NpuFxCompiler, _optimize_fx, _optimize_fx_of  # noqa: F401
from npugraph_ex.configs.compiler_config import CompilerConfig, _process_kwargs_options


def _settings(config: CompilerConfig):
    import npugraph_ex.ops  # noqa: F401  (the npugraph_ex:: ops the passes insert)
    import npugraph_ex.scope  # noqa: F401
    from pytest_npugraph.compiler.settings import settings_from_config
    from torch_npu.npu.utils import _is_gte_cann_version

    return settings_from_config(config, backend="npugraph_ex", cann_ge_9=_is_gte_cann_version("9.0.0", module="CANN")
                                ).replace(optimize=_optimize_fx_of("npugraph_ex.npu_fx_compiler"))


_NPUGRAPH_EX = _Flavor(CompilerConfig, _settings, _process_kwargs_options)


def get_compiler(compiler_config: CompilerConfig = None):
    return _NpuFxCompiler(CompilerConfig() if compiler_config is None else compiler_config, _NPUGRAPH_EX)


def compile_fx(gm, example_inputs=None, options=None):
    """Compile an (AOT) FX graph with ``options`` applied to a fresh config."""
    config = CompilerConfig()
    _process_kwargs_options(config, {"options": {} if options is None else options})
    return get_compiler(config)(gm, example_inputs)


def get_npu_backend(*, compiler_config: CompilerConfig = None, custom_decompositions: Dict = {}):  # noqa: B006
    """The backend for ``torch.compile(model, backend=npugraph_ex.get_npu_backend(compiler_config=config))``."""
    if compiler_config is None:
        compiler_config = CompilerConfig()
    decompositions = dict({} if custom_decompositions is None else custom_decompositions)
    return _backend(compiler_config, decompositions, _NPUGRAPH_EX)
