"""``npugraph_ex.inference``: the compile cache (not emulated)."""

from pytest_npugraph.errors import NotEmulated

__all__ = ["cache_compile", "readable_cache"]


def cache_compile(func, *, config=None, dynamic: bool = True, cache_dir=None, global_rank=None, tp_rank=None,
                  pp_rank=None, **kwargs):
    raise NotEmulated("pytest-npugraph does not emulate npugraph_ex.inference.cache_compile (the compiled "
                      "graph cache); compile with torch.compile(model, backend=\"npugraph_ex\") instead")


def readable_cache(cache_bin, print_output=True, file=None):
    raise NotEmulated("pytest-npugraph does not emulate npugraph_ex.inference.readable_cache")
