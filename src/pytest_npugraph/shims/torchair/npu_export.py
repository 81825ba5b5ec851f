"""``torchair.dynamo_export`` (mirrors ``npu_export.py``): the model compiled in GE export mode; its
first call writes ``export_path`` (``dynamo.pbtxt``, ``options.json``, ``<export_name>.air``; see
``pytest_npugraph.compiler.export``: the ``.air`` is a placeholder) instead of running."""
from __future__ import annotations

__all__ = ["dynamo_export"]

import os

import torch

from torchair.configs.compiler_config import CompilerConfig
from torchair.core.utils import logger


def _get_model_weight_names(model: torch.nn.Module) -> dict:
    names = {}
    for name, p in model.named_buffers():
        names[id(p)] = name
    for name, p in model.named_parameters():
        names[id(p)] = name
    return names


def _get_export_config(model, export_path: str, export_name: str, config: CompilerConfig) -> CompilerConfig:
    config.export.export_mode = True
    config.export.export_path_dir = export_path
    config.export.export_name = export_name
    config.experimental_config.enable_ref_data = True
    config.export.weight_name = _get_model_weight_names(model)
    return config


def _is_symlink(path) -> bool:
    path = os.path.abspath(path)
    if os.path.islink(path):
        logger.error(f"Target file path {path} should not be an symbolic link.")
        return True
    return False


def dynamo_export(*args, model: torch.nn.Module, export_path: str = "export_file", export_name: str = "export",
                  dynamic: bool = False, config=None, **kwargs):
    from torchair import get_npu_backend
    from torchair._ge_concrete_graph.fx2ge_converter import ExportSuccess

    export_name = os.path.split(export_name)[-1]
    if _is_symlink(export_path) or _is_symlink(os.path.join(export_path, export_name) + ".air"):
        return
    logger.info(f"dynamo_export: export_path: {export_path}, export_name: {export_name}, dynamic: {dynamic}")
    config = _get_export_config(model, export_path, export_name, CompilerConfig() if config is None else config)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=get_npu_backend(compiler_config=config), fullgraph=True, dynamic=dynamic)
    with torch.no_grad():
        try:
            compiled(*args, **kwargs)
        except ExportSuccess as e:
            logger.info(e)
        else:
            logger.info("export error!")
