"""What a test adds under the emulated packages' names in sys.modules is undone after it, however it
changed sys.modules (the plugin looks again only when sys.modules changed size or newest entry)."""
import pytest

TESTS = """
    import sys
    from unittest import mock

    import torch_npu

    SUB = "torch_npu.contrib.injected"

    def test_adds_a_submodule(npugraph):
        sys.modules[SUB] = mock.MagicMock()

    def test_sees_no_submodule_1(npugraph):
        assert SUB not in sys.modules

    def test_swaps_one_entry_for_another_keeping_the_size(npugraph):
        # one module out, one mock in: sys.modules keeps its size, its newest entry changes
        victim = next(n for n in sys.modules if n.startswith("json"))
        del sys.modules[victim]
        sys.modules[SUB] = mock.MagicMock()

    def test_sees_no_submodule_2(npugraph):
        assert SUB not in sys.modules
        assert not isinstance(sys.modules["torch_npu"], mock.MagicMock)

    def test_replaces_an_emulated_module_in_place(npugraph):
        sys.modules["torch_npu.npu"] = mock.MagicMock()

    def test_sees_the_emulated_module(npugraph):
        assert not isinstance(sys.modules["torch_npu.npu"], mock.MagicMock)
        assert torch_npu.npu.device_count() >= 1
"""


def test_added_and_swapped_entries_are_undone(pytester):
    pytester.makepyfile(test_modules=TESTS)
    pytester.makeconftest("import json.decoder\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore::pytest_npugraph.NpuHazardWarning")
    result.assert_outcomes(passed=6)


def test_the_lookup_is_not_repeated_while_sys_modules_is_unchanged(monkeypatch):
    import sys

    from pytest_npugraph import activation

    index = activation._PackageModules()
    first = index.names()
    assert index.names() is first                   # unchanged: the same list, no scan
    monkeypatch.setitem(sys.modules, "torchair._injected_for_test", object())
    assert "torchair._injected_for_test" in index.names()
