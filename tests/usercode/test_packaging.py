"""Packaging and API details: the typing marker, the declared Python, memory_stats counters, the
graphs-module errors that mirror the wheel, and a quiet interpreter exit."""
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch_npu

import pytest_npugraph

ROOT = pathlib.Path(pytest_npugraph.__file__).parent


def test_py_typed_is_shipped():
    assert (ROOT / "py.typed").is_file()
    pyproject = (ROOT.parent.parent / "pyproject.toml").read_text()
    assert 'pytest_npugraph = ["py.typed"]' in pyproject


def test_requires_python_covers_slots_dataclasses():
    """``@dataclass(slots=True)`` (and torch>=2.9 itself) need Python 3.10."""
    pyproject = (ROOT.parent.parent / "pyproject.toml").read_text()
    declared = re.search(r'requires-python = ">=3\.(\d+)"', pyproject)
    uses_slots = any("slots=True" in p.read_text() for p in ROOT.rglob("*.py"))
    assert declared and (not uses_slots or int(declared.group(1)) >= 10)


def test_memory_stats_count_ooms(npugraph):
    assert torch.npu.memory_stats() == {}          # not initialised yet, as torch_npu
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(1 << 45, device="npu")
    assert torch.npu.memory_stats()["num_ooms"] == 1
    assert torch.npu.memory_stats_as_nested_dict()["num_ooms"] == 1


def test_graph_errors_carry_the_suffix_as_the_wheel_does(npugraph):
    # torch_npu 2.14.0 raises RuntimeError(message, pta_error(...)) here: two arguments
    with pytest.raises(RuntimeError) as info:
        torch.npu.super_kernel_scope_begin("   ")
    assert info.value.args[0] == "scope_name should be None or a non-empty string."
    assert "ERR00001" in info.value.args[1]


def test_interpreter_exit_is_quiet_with_live_npu_tensors(pytester):
    pytester.makepyfile("""
        import torch, torch_npu
        KEEP = []

        def test_keeps_tensors(npugraph):
            KEEP.extend(torch.randn(64, device="npu") for _ in range(100))
            KEEP.append(torch.nn.Linear(8, 8).npu())
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1)
    assert "Exception ignored" not in result.stderr.str()
