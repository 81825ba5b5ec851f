"""The emulated ``npu-smi`` on PATH (issue 23 item 5): "is there an NPU" probes take the NPU branch."""
import os
import shutil
import subprocess
import tempfile

from pytest_npugraph import npu_smi


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:randomly", *args)


def test_npu_smi_info_lists_the_emulated_devices_of_the_test(pytester):
    pytester.makepyfile("""
        import os, shutil, subprocess, sys
        import pytest

        def test_one_device():
            assert shutil.which("npu-smi")
            out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True)
            assert out.returncode == 0
            rows = [l for l in out.stdout.splitlines() if "| OK " in l]
            assert len(rows) == 1 and "910B1" in rows[0]

        @pytest.mark.npu_devices(4)
        @pytest.mark.npu_chip("Ascend910B3")
        def test_four_devices_of_a_chip():
            out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, check=True).stdout
            rows = [l for l in out.splitlines() if "| OK " in l]
            assert len(rows) == 4 and all("910B3" in r for r in rows)
            assert "No running processes found in NPU 3" in out

        def test_a_child_process_sees_it_too():
            code = "import shutil, subprocess; print(subprocess.run(['npu-smi','info','-l'], capture_output=True, text=True).stdout)"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            assert "Total Count                    : 1" in out
    """)
    run(pytester).assert_outcomes(passed=3)


def test_board_and_chip_queries_as_setup_scripts_parse_them(pytester):
    """vLLM-Ascend's setup.py derives SOC_VERSION from `-l`, `-t board -i N` and `-t board -i N -c 0`."""
    pytester.makepyfile("""
        import subprocess
        import pytest

        def value(lines, key):
            for line in lines:
                line = " ".join(line.split())
                if key in line:
                    return line.split(":")[-1].strip()
            return ""

        def soc_version():
            lines = subprocess.check_output(["npu-smi", "info", "-l"]).decode().strip().split("\\n")
            npu_id = int(value(lines, "NPU ID"))
            board = subprocess.check_output(["npu-smi", "info", "-t", "board", "-i", str(npu_id)]).decode().split("\\n")
            assert not value(board, "Chip Name")
            chip = subprocess.check_output(["npu-smi", "info", "-t", "board", "-i", str(npu_id), "-c", "0"]).decode().split("\\n")
            name, kind, npu_name = value(chip, "Chip Name"), value(chip, "Chip Type"), value(chip, "NPU Name")
            return (kind + name).lower() if kind else (name + "_" + npu_name).lower()

        def test_a2():
            assert soc_version() == "ascend910b1"

        @pytest.mark.npu_chip("Ascend910_9391")
        @pytest.mark.npu_devices(2)
        def test_a3():
            assert soc_version() == "ascend910_9391"

        def test_missing_device_fails_like_the_tool():
            out = subprocess.run(["npu-smi", "info", "-t", "board", "-i", "7"], capture_output=True, text=True)
            assert out.returncode != 0 and "does not exist" in out.stderr

        def test_health():
            out = subprocess.run(["npu-smi", "info", "-i", "0", "-t", "health"], capture_output=True, text=True)
            assert out.returncode == 0 and out.stdout.strip().splitlines()[0].split(":")[-1].strip() == "OK"
    """)
    run(pytester).assert_outcomes(passed=4)


def test_conftest_probe_at_import_finds_it(pytester):
    """vLLM-Ascend's tests/ut conftest probes at import, before any test: the tool must already be there."""
    pytester.makeconftest("""
        import subprocess
        try:
            subprocess.run(["npu-smi", "info"], capture_output=True, check=True)
            NPU = True
        except (subprocess.CalledProcessError, FileNotFoundError):
            NPU = False
    """)
    pytester.makepyfile("""
        from conftest import NPU
        def test_probe():
            assert NPU
    """)
    run(pytester).assert_outcomes(passed=1)


def _without_outer_tool(monkeypatch):
    """This suite runs under the plugin too: take the outer session's npu-smi off PATH."""
    path = [d for d in os.environ["PATH"].split(os.pathsep) if "npugraph-npu-smi-" not in d]
    monkeypatch.setenv("PATH", os.pathsep.join(path))


def test_not_on_path_without_emulation(pytester, monkeypatch):
    _without_outer_tool(monkeypatch)
    pytester.makepyfile("""
        import os
        def test_no_tool():
            assert not any(os.path.exists(os.path.join(d, "npu-smi")) and "npugraph" in d
                           for d in os.environ["PATH"].split(os.pathsep))
    """)
    run(pytester, "--npu-emulate=off").assert_outcomes(passed=1)


def test_path_and_environment_restored_after_the_session(pytester, monkeypatch):
    """In-process session: PATH, the variables and the directory are given back at the end."""
    _without_outer_tool(monkeypatch)
    before = dict(os.environ)
    # the session's tool folder goes to a temporary directory of this test alone (other runs share /tmp)
    scratch = pytester.path / "scratch-tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    pytester.makepyfile("""
        import shutil
        def test_sees_it():
            assert shutil.which("npu-smi")
    """)
    pytester.runpytest_inprocess("-p", "no:randomly", "--npu-emulate=on").assert_outcomes(passed=1)
    assert os.environ.get("PATH") == before.get("PATH")
    for name in (npu_smi.ENV_CHIP, npu_smi.ENV_DEVICES):
        assert os.environ.get(name) == before.get(name)
    found = shutil.which("npu-smi")
    assert found is None or "npugraph-npu-smi-" not in found
    assert not [d for d in os.listdir(scratch) if d.startswith("npugraph-npu-smi-")]


def test_installed_object_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(npu_smi.ENV_CHIP, raising=False)
    tool = npu_smi.Installed("Ascend910B4", 2)
    try:
        assert os.environ["PATH"].split(os.pathsep)[0] == tool.directory
        out = subprocess.run([os.path.join(tool.directory, "npu-smi"), "info", "-m"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        assert out[0].split()[:2] == ["NPU", "ID"] and len(out) == 3 and out[2].split()[:3] == ["1", "0", "1"]
    finally:
        tool.remove()
    assert os.environ["PATH"] == str(tmp_path) and npu_smi.ENV_CHIP not in os.environ
    assert not os.path.exists(tool.directory)
