"""``get_npu_backend`` / ``get_compiler``: the torch.compile backend (mirrors ``npu_fx_compiler.py``);
the compilation itself is ``pytest_npugraph.compiler.pipeline``.  npugraph_ex's backend is this one
with its own ``_Flavor`` (its flat config, its ``options`` handling, its op namespace).

The backend reads the ``CompilerConfig`` once, when it is created, into the compiler's frozen
``Settings``; ``options={...}`` (``torch.compile(..., options=...)``) are applied to a copy of the
config, so the user's config object is never changed by compiling."""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Callable, Dict, List

import torch

from torchair._utils.error_code import pretty_error_msg
from torchair.configs.compiler_config import CompilerConfig, _check_config_support
from torchair.configs.npugraphex_config import _process_kwargs_options


def _settings(config: CompilerConfig):
    from pytest_npugraph.compiler.settings import settings_from_config

    if not hasattr(config, "mode"):
        raise AttributeError(f"'{type(config).__name__}' object has no attribute 'mode'")
    from torch_npu.npu.utils import _is_gte_cann_version

    if config.mode.value in ("reduce-overhead", "npugraph_ex"):
        import torchair.ops._tagged_event  # noqa: F401  (the air.tagged_event_* ops the passes insert)
        import torch_npu.dynamo.npugraph_ex  # noqa: F401  (native stream events use the npugraph_ex:: ops)
    return settings_from_config(config, cann_ge_9=_is_gte_cann_version("9.0.0", module="CANN")).replace(
        optimize=_run_optimize_fx)


class _Observer:
    """What ``_optimize_fx`` gets as its ``observer`` (TorchAir's GraphTransformObserver): the graph
    being optimised (``gm``) and what the passes need."""

    def __init__(self, settings, example_inputs):
        self.settings = settings
        self.example_inputs = example_inputs
        self.gm = None


def _optimize_fx(graph_module: torch.fx.GraphModule, config: CompilerConfig, observer: _Observer):
    """The FX passes before the graph is converted (TorchAir's ``_optimize_fx``; tests wrap it to look
    at the optimised graph): custom pre pass, no-op removal, view -> reshape, custom post pass."""
    from pytest_npugraph.compiler.pipeline import optimize_fx

    observer.gm = optimize_fx(graph_module, observer.settings, observer.example_inputs)
    return observer.gm


def _optimize_fx_of(module_name: str) -> Callable:
    """The compiler's optimize step: ``<module_name>._optimize_fx`` looked up at each compile, so a
    wrapper a test installs on that module is called (torchair's, or npugraph_ex's module)."""
    def run(gm, settings, example_inputs):
        import importlib

        result = importlib.import_module(module_name)._optimize_fx(gm, settings.config, _Observer(settings, example_inputs))
        return gm if result is None else result
    return run


_run_optimize_fx = _optimize_fx_of("torchair.npu_fx_compiler")


@dataclass(frozen=True)
class _Flavor:
    """What differs between torchair's backend and npugraph_ex's: the config class, how a config
    becomes ``Settings`` and how ``options={...}`` are applied."""
    config_class: type
    settings: Callable
    process_options: Callable


_TORCHAIR = _Flavor(CompilerConfig, _settings, _process_kwargs_options)


class _NpuFxCompiler:
    """Compiles FX graphs for the NPU (called by AOTAutograd for each graph)."""

    def __init__(self, compiler_config, flavor: _Flavor = _TORCHAIR) -> None:
        self.config = compiler_config
        self.settings = flavor.settings(compiler_config)

    @pretty_error_msg
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor]):
        from pytest_npugraph.compiler.pipeline import NpuFxCompiler

        return NpuFxCompiler(self.settings)(gm, example_inputs)


def get_compiler(compiler_config: CompilerConfig = None):
    return _NpuFxCompiler(CompilerConfig() if compiler_config is None else compiler_config)


def _npu_backend(gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor], compiler_config: CompilerConfig = None,
                 decompositions: Dict = {}, settings=None, *, flavor: _Flavor = _TORCHAIR,  # noqa: B006
                 **kwargs):  # (as torchair's signature)
    from pytest_npugraph.compiler.pipeline import compile_graph

    if compiler_config is None:
        compiler_config = flavor.config_class()
    if kwargs.get("options") or settings is None:
        compiler_config = copy.deepcopy(compiler_config)
        flavor.process_options(compiler_config, kwargs)
        settings = flavor.settings(compiler_config)
    return compile_graph(gm, example_inputs, settings, decompositions, wrap_errors=pretty_error_msg)


def _backend(compiler_config, decompositions: Dict, flavor: _Flavor = _TORCHAIR):
    """The backend callable of a config (its ``Settings`` read now)."""
    return functools.partial(_npu_backend, compiler_config=compiler_config, decompositions=decompositions,
                             settings=flavor.settings(compiler_config), flavor=flavor)


def get_npu_backend(*, compiler_config: CompilerConfig = None, custom_decompositions: Dict = {}):  # noqa: B006
    """The backend for ``torch.compile(model, backend=get_npu_backend(compiler_config=config))``."""
    if compiler_config is None:
        compiler_config = CompilerConfig()
    _check_config_support(compiler_config)
    decompositions = {}
    if custom_decompositions is not None:
        if not hasattr(custom_decompositions, "keys") and not hasattr(custom_decompositions, "__iter__"):
            raise TypeError(f"'{type(custom_decompositions).__name__}' object is not iterable")  # dict.update's
        decompositions.update(custom_decompositions)
    return _backend(compiler_config, decompositions)
