"""A conftest.py that stubs torch_npu / torch.npu over the emulation (issue 23 item 6): one clear error
naming its lines and the fix, instead of a half-mocked run; the conditional stubs of vLLM-Ascend's
tests/ut conftest stay off because the emulated npu-smi is on PATH."""
import pytest

from pytest_npugraph import mock_guard


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:randomly", *args)


def test_module_stub_in_conftest_is_one_error_naming_the_lines(pytester):
    pytester.makeconftest("""
        import sys
        from unittest.mock import MagicMock
        import torch

        sys.modules["torch_npu"] = MagicMock()
        torch.npu = MagicMock()
    """)
    pytester.makepyfile("def test_a():\n    import torch_npu\n")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert err.count("npugraph: conftest.py replaced the emulated torch_npu, torch.npu with a stub") == 1
    assert 'conftest.py:5: sys.modules["torch_npu"] = MagicMock()' in err
    assert "conftest.py:6: torch.npu = MagicMock()" in err
    assert "--npu-emulate=off" in err and "migrating-from-magicmock.md" in err


def test_stub_in_a_nested_conftest_collected_later(pytester):
    pytester.makepyfile(test_top="def test_top():\n    pass\n")
    sub = pytester.mkpydir("sub")
    (sub / "conftest.py").write_text("import torch\nfrom unittest import mock\ntorch.npu = mock.MagicMock()\n")
    (sub / "test_sub.py").write_text("def test_sub():\n    pass\n")
    other = pytester.mkpydir("other")      # a second stubbing conftest: still one report
    (other / "conftest.py").write_text("import torch\nfrom unittest import mock\ntorch.npu = mock.MagicMock()\n")
    (other / "test_other.py").write_text("def test_other():\n    pass\n")
    result = run(pytester)
    # a conftest met during collection: a collection error, which stops the session before any test
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    # one report (the short summary repeats it in full when the terminal is wide, so count the E lines)
    reports = [line for line in out.splitlines() if line.startswith("E ") and "replaced the emulated torch.npu" in line]
    assert len(reports) == 1
    assert "conftest.py:3: torch.npu = mock.MagicMock()" in out
    result.assert_outcomes(errors=1)


def test_stub_module_built_by_hand_is_caught_too(pytester):
    """vLLM-Ascend's shape: a types.ModuleType with MagicMock attributes put into sys.modules."""
    pytester.makeconftest("""
        import sys, types
        from unittest.mock import MagicMock
        torch_npu = types.ModuleType("torch_npu")
        torch_npu.npu = MagicMock()
        sys.modules["torch_npu"] = torch_npu
    """)
    pytester.makepyfile("def test_a():\n    pass\n")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert 'conftest.py:5: sys.modules["torch_npu"] = torch_npu' in result.stderr.str()


def test_vllm_ascend_style_conditional_stubs_stay_off_under_emulation(pytester):
    """The probe finds the emulated npu-smi, so the stubs are skipped and the tests get the emulation."""
    pytester.makeconftest("""
        import subprocess, sys
        from unittest.mock import MagicMock
        try:
            subprocess.run(["npu-smi", "info"], capture_output=True, check=True)
            _npu_available = True
        except (subprocess.CalledProcessError, FileNotFoundError):
            _npu_available = False
        if not _npu_available:
            sys.modules["torch_npu"] = MagicMock()
            import torch
            torch.npu = MagicMock()
    """)
    pytester.makepyfile("""
        import torch, torch_npu

        def test_real_values():
            assert torch_npu._EMULATED
            x = torch.ones(3, device="npu")
            torch.testing.assert_close(torch_npu.npu_rms_norm(x, torch.ones(3, device="npu"))[0].cpu(),
                                       torch.ones(3))
            assert isinstance(torch.npu.Stream(), torch_npu.npu.Stream)
    """)
    run(pytester).assert_outcomes(passed=1)


def test_without_emulation_stubs_are_left_alone(pytester):
    pytester.makeconftest("""
        import sys
        from unittest.mock import MagicMock
        sys.modules["torch_npu"] = MagicMock()
    """)
    pytester.makepyfile("def test_a():\n    import torch_npu\n    torch_npu.npu_rms_norm.assert_not_called()\n")
    run(pytester, "--npu-emulate=off").assert_outcomes(passed=1)


def test_clean_conftest_is_silent(pytester):
    pytester.makeconftest("import torch, torch_npu\n")
    pytester.makepyfile("def test_a():\n    import torch\n    assert torch.ones(1, device='npu').cpu().item() == 1\n")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    assert "replaced the emulated" not in result.stderr.str() + result.stdout.str()


def test_stub_lines_patterns(tmp_path):
    conftest = tmp_path / "conftest.py"
    conftest.write_text("\n".join([
        "import sys, torch",
        "sys.modules['torch_npu.npu'] = object()",
        "monkeypatch.setitem(sys.modules, 'torch_npu', m)",
        "patch.dict(sys.modules, {'torchair': m})",
        "sys.modules.setdefault('torch_npu', m)",
        "setattr(torch, 'npu', m)",
        "if torch.npu == x: pass",
        "sys.modules['other'] = m",
    ]))
    assert [n for n, _ in mock_guard.stub_lines(str(conftest))] == [2, 3, 4, 5, 6]


def test_test_module_stubbing_at_import_is_undone_for_its_tests_and_later_ones(pytester):
    """vLLM-Ascend's kv_offload tests set ``torch.npu = fake.npu`` at module level, unconditionally: the
    stub stays for the rest of the session unless undone, and ``patch("torch.npu.x")`` in later modules
    then lands on the emulated ``sys.modules["torch.npu"]`` while code calls the stub."""
    pytester.makepyfile(
        test_a_stubs="""
            import sys, types
            from unittest.mock import MagicMock
            import torch
            import torch_npu

            fake = types.ModuleType("torch_npu")
            fake.npu = MagicMock()
            sys.modules.setdefault("torch_npu", fake)
            torch.npu = fake.npu

            def test_own_module_runs_on_the_emulation():
                assert torch.npu is torch_npu.npu
                assert torch.ones(2, device="npu").device.type == "npu"
        """,
        test_b_later="""
            from unittest.mock import patch
            import torch

            def get_device_name(i):
                return torch.npu.get_device_name(i)

            def test_patch_lands_where_code_looks():
                assert not type(torch.npu).__name__.endswith("Mock")
                with patch("torch.npu.get_device_name", return_value="Ascend910B2") as name:
                    assert get_device_name(0) == "Ascend910B2"
                name.assert_called_once_with(0)
        """)
    result = run(pytester, "-W", "always")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "npugraph: test_a_stubs.py replaced the emulated torch.npu with a stub when imported" in out
    assert "line 9: torch.npu = fake.npu" in out


def test_test_module_stubbing_is_left_alone_without_emulation(pytester):
    pytester.makepyfile(test_a="""
        from unittest.mock import MagicMock
        import torch

        torch.npu = MagicMock()

        def test_a():
            assert isinstance(torch.npu, MagicMock)
    """)
    run(pytester, "--npu-emulate=off").assert_outcomes(passed=1)


def test_torch_version_cann_is_the_emulated_release(pytester):
    """Importing torch_npu sets ``torch.version.cann`` (vLLM-Ascend's find_hccl_library reads it)."""
    pytester.makepyfile("""
        import pytest
        import torch
        import torch_npu

        def test_default():
            assert torch.version.cann == "8.5.0"

        @pytest.mark.npu_cann("9.0.0")
        def test_marker():
            assert torch.version.cann == "9.0.0"
    """)
    run(pytester).assert_outcomes(passed=2)
