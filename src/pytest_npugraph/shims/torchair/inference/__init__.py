"""``torchair.inference``: ``cache_compile`` (compiled with the torchair backend; the on-disk cache is
not emulated), ``set_dim_gears`` (GE gears: recorded on the tensor, not used)."""
from __future__ import annotations

import functools
import os
from typing import Callable, Dict, List, Optional

import torch

from torchair.configs.compiler_config import CompilerConfig
from pytest_npugraph.errors import NotEmulated

__all__ = ["cache_compile", "readable_cache", "set_dim_gears"]


def cache_compile(func, *, config: Optional[CompilerConfig] = None, backend=None, dynamic: bool = True,
                  cache_dir: Optional[str] = None, global_rank: Optional[int] = None, tp_rank: Optional[int] = None,
                  pp_rank: Optional[int] = None, custom_decompositions: Optional[dict] = None, ge_cache: bool = False,
                  **kwargs) -> Callable:
    """``func`` (an ``nn.Module`` method) compiled with torchair's backend, checked as torchair checks it;
    the on-disk cache itself is not emulated (each process compiles again)."""
    from torchair import get_npu_backend

    config = _checked_cache_args(func, config, backend, cache_dir)
    if config is not None and ge_cache and config.mode.value in ("reduce-overhead", "npugraph_ex"):
        from torchair.core.utils import logger

        logger.warning_once(f"Ge_cache will not take effect when config.mode is set to {config.mode.value}.")
    return _compiled(func, get_npu_backend(compiler_config=config or CompilerConfig(),
                                           custom_decompositions=custom_decompositions or {}), dynamic)


def _checked_cache_args(func, config, backend, cache_dir):
    """The config ``cache_compile`` uses, after its checks (same order and texts as torchair's)."""
    import types

    if config is not None and backend is not None:
        if backend.keywords.get("compiler_config") != config:
            raise ValueError("config in current backend is different from the config during cache generation.")
    elif config is None and backend is not None:
        config = backend.keywords.get("compiler_config")
    if not isinstance(func, types.MethodType):
        raise ValueError(f"Only method can be cached now, got {func}")
    if not isinstance(func.__self__, torch.nn.Module):
        raise ValueError(f"Only torch.nn.Module method can be cached now, got {func}")
    if cache_dir is not None and os.path.exists(cache_dir) and os.stat(cache_dir).st_uid != os.getuid():
        raise ValueError(f"Cache dir {cache_dir} must be owned by the current user ")
    return config


def _compiled(func, backend, dynamic: bool):
    """``func`` compiled on its first call (torchair compiles lazily too), keeping ``func``'s name."""
    compiled = None

    @functools.wraps(func)
    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(func, backend=backend, dynamic=dynamic)
        return compiled(*args, **kwargs)

    return call


def readable_cache(cache_bin, print_output=True, file=None):
    raise NotEmulated("pytest-npugraph does not emulate torchair's compile cache files")


def set_dim_gears(t: torch.Tensor, dim_gears: Dict[int, List[int]]):
    """Checked in the real order and with its AssertionError texts (inference/_gear_utils.py)."""
    previous = getattr(t, "_torchair_dim_gears", None)
    if previous is not None and previous != dim_gears:
        raise AssertionError(f"Tensor {t} already has set dim gears, and it is not supported to set it again.")
    for dim_index, gears in dim_gears.items():
        if not isinstance(dim_index, int):
            raise AssertionError(f"Dim index in dim_gears must be an integer, but got {type(dim_index)}.")
        if dim_index < 0 or dim_index >= len(t.shape):
            raise AssertionError(f"Dim index in dim_gears must be in range [0, {len(t.shape) - 1}], but got {dim_index}.")
        if not isinstance(gears, (list, tuple)):
            raise AssertionError(f"Gears for dim index {dim_index} in dim_gears must be a list or tuple, "
                                 f"but got {type(gears)}.")
        for index, gear in enumerate(gears):
            if not isinstance(gear, int):
                raise AssertionError(f"Element at index {index} of value for dim index {dim_index} in "
                                     f"dim_gears must be an integer, but got {type(gear)}.")
            if gear == 0:
                raise AssertionError(f"Gear value at index {index} for dim index {dim_index} must not be 0, "
                                     f"but got {gear}.")
        if not 2 <= len(gears) <= 100:
            raise AssertionError(f"Length of gears for dim index {dim_index} in dim_gears must be in "
                                 f"range [2, 100], but got {len(gears)}.")
        torch._dynamo.mark_dynamic(t, dim_index)
    t._torchair_dim_gears = dim_gears
