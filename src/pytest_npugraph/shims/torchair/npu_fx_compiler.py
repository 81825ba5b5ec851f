"""``get_npu_backend`` / ``get_compiler``: the torch.compile backend (mirrors ``npu_fx_compiler.py``);
the compilation itself is ``pytest_npugraph.runtime.compiler.pipeline``."""
from __future__ import annotations

import functools
from typing import Dict, List

import torch

from torchair._utils.error_code import pretty_error_msg
from torchair.configs.compiler_config import CompilerConfig, _check_config_support
from torchair.configs.npugraphex_config import _process_kwargs_options


class _NpuFxCompiler:
    """Compiles FX graphs for the NPU (called by AOTAutograd for each graph)."""

    def __init__(self, compiler_config: CompilerConfig) -> None:
        self.config = compiler_config

    @pretty_error_msg
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor]):
        from pytest_npugraph.runtime.compiler.pipeline import NpuFxCompiler

        return NpuFxCompiler(self.config)(gm, example_inputs)


def get_compiler(compiler_config: CompilerConfig = None):
    return _NpuFxCompiler(CompilerConfig() if compiler_config is None else compiler_config)


def _npu_backend(gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor], compiler_config: CompilerConfig = None,
                 decompositions: Dict = {}, **kwargs):  # noqa: B006  (as torchair's signature)
    from pytest_npugraph.runtime.compiler.pipeline import compile_graph

    if compiler_config is None:
        compiler_config = CompilerConfig()
    _process_kwargs_options(compiler_config, kwargs)
    return compile_graph(gm, example_inputs, compiler_config, decompositions)


def get_npu_backend(*, compiler_config: CompilerConfig = None, custom_decompositions: Dict = {}):  # noqa: B006
    """The backend for ``torch.compile(model, backend=get_npu_backend(compiler_config=config))``."""
    if compiler_config is None:
        compiler_config = CompilerConfig()
    _check_config_support(compiler_config)
    return functools.partial(_npu_backend, compiler_config=compiler_config, decompositions=dict(custom_decompositions))
