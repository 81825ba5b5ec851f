"""``torchair.inference``: ``cache_compile`` (compiled with the torchair backend; the on-disk cache is
not emulated), ``set_dim_gears`` (GE gears: recorded on the tensor, not used)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from torchair.configs.compiler_config import CompilerConfig

__all__ = ["cache_compile", "readable_cache", "set_dim_gears"]


def cache_compile(func, *, config: Optional[CompilerConfig] = None, dynamic: bool = True,
                  cache_dir: Optional[str] = None, global_rank: Optional[int] = None, tp_rank: Optional[int] = None,
                  pp_rank: Optional[int] = None, **kwargs) -> Callable:
    from torchair import get_npu_backend

    return torch.compile(func, backend=get_npu_backend(compiler_config=config or CompilerConfig()), dynamic=dynamic)


def readable_cache(cache_bin, print_output=True, file=None):
    raise NotImplementedError("pytest-npugraph does not emulate torchair's compile cache files")


def set_dim_gears(t: torch.Tensor, dim_gears: Dict[int, List[int]]):
    t._torchair_dim_gears = dim_gears
