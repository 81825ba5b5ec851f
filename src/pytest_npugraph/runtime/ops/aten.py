"""Core profiles of the aten ops that matter for core analysis.

Keyed by the op's base name ("nonzero" for ``aten::nonzero.out``); any other aten op is
``DEFAULT_ATEN_CORES`` (a vector op on every vector core).
"""
from __future__ import annotations

from .spec import cores, cube, vector

# torch_npu has no npu_nonzero: aten nonzero is the full-core-sync op (NonZero must hold every
# vector core at once), the classic partner of AIV collectives in a core-occupation deadlock.
ATEN_CORES = {"nonzero": cores("AIV", vector="all", all_resident=True)}
ATEN_CORES.update({name: cube() for name in (
    "mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "addbmm", "mv", "addmv",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "convolution_backward")})
DEFAULT_ATEN_CORES = vector()
