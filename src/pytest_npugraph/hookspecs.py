"""Hooks users implement in conftest.py (added with ``pytest_addhooks``; docs/reference.md, "Hooks").

Type names only (``TYPE_CHECKING``): loading the plugin imports neither torch nor networkx.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import pytest

if TYPE_CHECKING:
    from .hazard import Hazard
    from .runtime.ops.library import OpRegistry

#: A core profile: ``{"kind": "AIV", "vector": 16, "cube": 0, "all_resident": True}``.
OpProfile = dict[str, Union[str, int, bool]]


@pytest.hookspec(firstresult=True)
def pytest_npugraph_op_profile(op_name: str) -> Optional[OpProfile]:
    """Return the core usage of ``op_name``, or None to leave it to the plugin.

    :param op_name: the op as the trace names it, without namespace: ``"npu_moe_distribute_dispatch"``
        for ``torch.ops.npu.npu_moe_distribute_dispatch``, ``"reduce_scatter"`` / ``"all_reduce"`` for
        ``torch.distributed`` collectives, ``"nonzero"`` for ``aten::nonzero``.
    :returns: a dict with ``kind`` (``"AICore"``, ``"AIV"``, ``"AICPU"``, ``"ATB"``, ``"HCCL"`` or
        ``"MC2"``), ``cube`` and ``vector`` block counts (ints, or ``"all"`` for every core of the
        device), ``all_resident`` (every block must hold a core at once, as NonZero and AIV
        collectives do), ``limit_applies`` (default False for AICPU and ATB) and
        ``set_next_task_start`` (the kernel lets the next SuperKernel sub-kernel start early); or
        None.  The first non-None answer wins over the plugin's own profiles and the HCCL mode.
    """


@pytest.hookspec
def pytest_npugraph_register_ops(registry: OpRegistry) -> None:
    """Add CPU implementations of custom ops.

    :param registry: call ``registry.register(name, schema, impl, cores=None)``: ``name`` the op
        (``"npu_my_op"``; it becomes ``torch_npu.npu_my_op`` and ``torch.ops.npu.npu_my_op``; a
        qualified name, ``"_C_ascend::rotary_embedding"``, or ``namespace="_C_ascend"`` defines it in
        that namespace, ``torch.ops._C_ascend.rotary_embedding``, for a C++ extension's ops),
        ``schema`` its torch schema (``"npu_my_op(Tensor x, int k=1) -> Tensor"``), ``impl`` a function
        of CPU tensors returning what the schema returns, ``cores`` its profile (as
        ``pytest_npugraph_op_profile`` returns).  Registering an op torch_npu already has (with its
        real schema) replaces the emulator's kernel.
    """


@pytest.hookspec
def pytest_npugraph_hazard(item: pytest.Item, hazard: Hazard) -> Any:
    """Called for each hazard found in a test, when the test ends (before its outcome is decided).

    :param item: the test.
    :param hazard: the finding: ``kind``, ``message``, ``where`` (your ``path:line``s), ``streams``,
        ``ops``, ``severity`` (``"error"`` or ``"warning"``); see ``pytest_npugraph.Hazard``.
    """
