"""Hooks users implement in conftest.py (added with ``pytest_addhooks``)."""
import pytest


@pytest.hookspec(firstresult=True)
def pytest_npugraph_op_profile(op_name):
    """Return the core usage of ``op_name`` (an op the plugin does not know), or None.

    A dict such as ``{"kind": "AIV", "vector": 16, "cube": 0, "all_resident": True}``
    (kind: AICore, AIV, AICPU, ATB, HCCL or MC2; counts are blocks, or ``"all"``).
    """


def pytest_npugraph_register_ops(registry):
    """Add CPU implementations of custom ops: ``registry.register(name, schema, impl, cores=None)``.

    Registering an op torch_npu already has (with its real schema) replaces the emulator's kernel.
    A qualified name (``"_C_ascend::rotary_embedding"``) or ``namespace="_C_ascend"`` defines the op
    in that namespace (``torch.ops._C_ascend.rotary_embedding``), for a C++ extension's ops.
    """


def pytest_npugraph_hazard(item, hazard):
    """Called for each hazard found in test ``item``."""
