"""``torchair._acl_concrete_graph.static_kernel``: TorchAir's CANN static-kernel compilation
(``experimental_config.aclgraph._aclnn_static_shape_kernel``: dump the ops' shapes, compile run
packages with CANN's op compiler, install them).  The module imports, as users' and TorchAir's tests
import it; its entry points raise ``pytest_npugraph.NotEmulated``: the emulator compiles no kernels
(what static kernels change at run time, core limits before CANN 9, is emulated by the aclgraph modes)."""
from __future__ import annotations

from pytest_npugraph.errors import NotEmulated

__all__ = ["compile_static_kernel", "static_compile", "uninstall_static_kernel"]


def _not_emulated(name: str):
    raise NotEmulated(f"pytest-npugraph does not emulate CANN's static kernel compilation: {__name__}.{name} "
                      f"builds and installs run packages with CANN's op compiler, which the emulated device does "
                      f"not have")


def compile_static_kernel(fx_func, *args, config=None, build_dir=None, **kwargs):
    _not_emulated("compile_static_kernel")


def static_compile(result_root, chosen_dir, rank: int = None, config=None) -> bool:
    _not_emulated("static_compile")


def uninstall_static_kernel():
    _not_emulated("uninstall_static_kernel")
