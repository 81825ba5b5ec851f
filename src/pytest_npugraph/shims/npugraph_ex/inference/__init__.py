"""``npugraph_ex.inference``: ``cache_compile`` is torchair's (``torchair.inference``: the same checks,
compiled lazily; the on-disk cache is not emulated) with npugraph_ex's config and backend."""
from __future__ import annotations

__all__ = ["cache_compile", "readable_cache"]

from typing import Callable, Optional

from torchair.inference import _checked_cache_args, _compiled, readable_cache  # noqa: F401


def cache_compile(func, *, config=None, backend=None, dynamic: bool = True, cache_dir: Optional[str] = None,
                  global_rank: Optional[int] = None, tp_rank: Optional[int] = None, pp_rank: Optional[int] = None,
                  custom_decompositions: Optional[dict] = None, **kwargs) -> Callable:
    from npugraph_ex import CompilerConfig, get_npu_backend

    config = _checked_cache_args(func, config, backend, cache_dir)
    return _compiled(func, get_npu_backend(compiler_config=config or CompilerConfig(),
                                           custom_decompositions=custom_decompositions or {}), dynamic)
