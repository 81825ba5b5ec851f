"""The plugin as users meet it: options, markers, activation, outcomes, isolation, xdist.

Most cases run pytest in a subprocess: the npu device is registered with torch once per process.
"""
import re

import pytest

def run(pytester, *args):
    """pytest in a subprocess, in file order unless the test asks for pytest-randomly."""
    if not any("randomly" in a for a in args):
        args = ("-p", "no:randomly") + args
    return pytester.runpytest_subprocess(*args)


RACE = """
import torch, torch_npu

def test_race():
    x = torch.ones(4, device="npu")
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        y = x * 2
    z = y + 1
"""


def test_markers_listed_and_accepted_under_strict_markers(pytester):
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(["*npu_cores(aicore=N, vector=M)*", "*npu_chip(NAME)*", "*npu_devices(N)*",
                                 "*npu_allow(KIND, ...)*"])
    pytester.makepyfile("""
        import pytest
        @pytest.mark.npu_cores(aicore=8, vector=16)
        @pytest.mark.npu_chip("Ascend910B3")
        @pytest.mark.npu_devices(2)
        @pytest.mark.npu_allow("race")
        def test_marked(npugraph):
            assert (npugraph.chip, npugraph.cube_cores, npugraph.vector_cores, npugraph.device_count) == \\
                ("Ascend910B3", 8, 16, 2)
    """)
    run(pytester, "--strict-markers").assert_outcomes(passed=1)


@pytest.mark.parametrize("marker, message", [
    ("npu_cores(aicore=0)", "npu_cores: aicore must be a positive int, got 0"),
    ("npu_cores(aicore=4, vector=-1)", "npu_cores: vector must be a positive int, got -1"),
    ("npu_cores(vector=4)", "npu_cores needs aicore=N"),
    ("npu_chip('Ascend999')", "npu_chip: unknown chip 'Ascend999'"),
    ("npu_devices(0)", "npu_devices: the device count must be a positive int, got 0"),
    ("npu_allow('races')", "npu_allow: unknown hazard kind 'races'"),
    ("npu_cann('8.4.0')", "npu_cann: unknown CANN version '8.4.0'; known versions: 8.0.0, 8.5.0, 9.0.0"),
    ("npu_cann(9)", "npu_cann takes one version string"),
])
def test_malformed_marker_is_a_usage_error_naming_marker_and_test(pytester, marker, message):
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.{marker}
        def test_bad():
            pass
    """)
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_bad*{message}*"])


def test_bad_options_are_usage_errors(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = run(pytester, "--npu-chip=Ascend1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--npu-chip*unknown chip 'Ascend1'*"])
    pytester.makeini("[pytest]\nnpu_hazards = loud\n")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*npu_hazards must be one of error, warn, off*"])
    result = run(pytester, "-c", "/dev/null", "--npu-cann=8.4")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--npu-cann / npu_cann: unknown CANN version '8.4'; known versions: 8.0.0, "
                                 "8.5.0, 9.0.0*"])


def test_cann_from_the_ini_the_option_and_the_marker(pytester):
    """--npu-cann over the ini's npu_cann over the default; the marker over both, per test."""
    pytester.makepyfile("""
        import pytest, torch_npu

        def test_session(npugraph, request):
            expected = request.config.getoption("npu_cann") or "8.0.0"
            assert torch_npu.npu.utils.get_cann_version() == expected

        @pytest.mark.npu_cann("9.0.0")
        def test_marked(npugraph):
            assert torch_npu.npu.utils.get_cann_version() == "9.0.0"
    """)
    pytester.makeini("[pytest]\nnpu_cann = 8.0.0\n")
    result = run(pytester, "--npu-emulate=on")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["npugraph: NPU emulation on (*; CANN 8.0.0), hazards: error"])
    result = run(pytester, "--npu-emulate=on", "--npu-cann=9.0.0")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["npugraph: NPU emulation on (*; CANN 9.0.0), hazards: error"])


def test_loading_the_plugin_imports_neither_torch_nor_networkx(pytester):
    pytester.makepyfile("""
        import sys
        def test_unrelated():
            assert "torch" not in sys.modules
            assert "networkx" not in sys.modules
            assert "pytest_npugraph.plugin" in sys.modules
    """)
    run(pytester, "--npu-emulate=on").assert_outcomes(passed=1)


def test_module_level_import_is_emulated_during_collection(pytester):
    pytester.makeconftest("import torch_npu\nassert torch_npu._EMULATED\n")
    pytester.makepyfile("""
        import torch, torch_npu, torchair_probe
        X = torch.ones(3).npu()          # created at collection time
        def test_uses_module_level_tensor():
            assert X.device.type == "npu" and X.is_npu
            assert (X + 1).cpu().tolist() == [2.0, 2.0, 2.0]
            assert torch.npu is torch_npu.npu
    """, torchair_probe="")
    run(pytester, "--npu-emulate=on").assert_outcomes(passed=1)


def test_emulation_off_leaves_torch_npu_alone(pytester):
    pytester.makepyfile("""
        import importlib.util, sys
        def test_no_emulation():
            assert importlib.util.find_spec("torch_npu") is None
            assert "torch_npu" not in sys.modules
        def test_fixture_skips(npugraph):
            pass
    """)
    result = run(pytester, "--npu-emulate=off", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*NPU emulation is off*"])
    result.stdout.fnmatch_lines(["npugraph: NPU emulation off"])


def test_report_header_names_chip_and_mode(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = run(pytester, "--npu-emulate=on", "--npu-chip=Ascend910B4", "--npu-hazards=warn")
    result.stdout.fnmatch_lines(["npugraph: NPU emulation on (Ascend910B4: 20 cube / 40 vector cores, 32 GiB "
                                 "per device; CANN 8.5.0), hazards: warn"])


def test_race_fails_the_test_with_a_report_at_user_lines(pytester):
    pytester.makepyfile(test_race=RACE)
    result = run(pytester, "--npu-emulate=on")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*npugraph found 2 hazard(s)*", "*race*test_race.py:7*test_race.py:4*"])
    assert "site-packages" not in result.stdout.str() and "pytest_npugraph/" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*npugraph hazards by kind*", "race*2*test_race*"])


def test_hazard_modes_warn_and_off(pytester):
    pytester.makepyfile(test_race=RACE)
    result = run(pytester, "--npu-emulate=on", "--npu-hazards=warn")
    result.assert_outcomes(passed=1, warnings=2)
    result.stdout.fnmatch_lines(["*NpuHazardWarning*race*"])
    result = run(pytester, "--npu-emulate=on", "--npu-hazards=off")
    result.assert_outcomes(passed=1)
    assert "NpuHazardWarning" not in result.stdout.str()
    assert re.search(r"race\s+0\s+0\s+0\s+0\s+2\s+test_race", result.stdout.str())


def test_npu_allow_expect_and_assert_clean(pytester):
    pytester.makepyfile(RACE.replace("def test_race():", "import pytest\n@pytest.mark.npu_allow('race')\n"
                                                         "def test_race():") + """

def test_expect_absorbs(npugraph):
    x = torch.ones(4, device="npu")
    s = torch.npu.Stream()
    with npugraph.expect("race", match="stream-"):
        with torch.npu.stream(s):
            y = x * 2
    assert npugraph.hazards == []

def test_expect_without_hazard_fails(npugraph):
    with npugraph.expect("race"):
        torch.ones(2, device="npu") + 1

def test_assert_clean_raises(npugraph):
    x = torch.ones(4, device="npu")
    with torch.npu.stream(torch.npu.Stream()):
        x.mul_(2)
    try:
        npugraph.assert_clean("missing-record-stream")     # other kinds: clean
    except AssertionError:
        raise RuntimeError("assert_clean ignored its kinds")
    npugraph.assert_clean()
""")
    result = run(pytester, "--npu-emulate=on", "-rA")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*_ test_expect_without_hazard_fails _*",
                                 "npugraph.expect('race'): the block produced no such hazard",
                                 "*_ test_assert_clean_raises _*", "*AssertionError: npugraph found 1 hazard(s)*"])
    # failed (the assert_clean test), expected (absorbed), allowed (npu_allow)
    assert re.search(r"race\s+1\s+1\s+2\s+0\s+0\s+test_", result.stdout.str())


def test_user_hooks_profile_register_ops_and_hazard(pytester):
    pytester.makeconftest("""
        import torch
        SEEN = []
        def pytest_npugraph_register_ops(registry):
            registry.register("npu_double", "npu_double(Tensor x) -> Tensor", lambda x: x * 2,
                              cores={"kind": "AICPU"})
        def pytest_npugraph_op_profile(op_name):
            return {"kind": "AIV", "vector": 7} if op_name == "sigmoid" else None
        def pytest_npugraph_hazard(item, hazard):
            SEEN.append((item.name, hazard.kind))
        def pytest_sessionfinish(session):
            print("HAZARDS SEEN", sorted(set(SEEN)))
    """)
    pytester.makepyfile(RACE + """
import pytest

def test_hooks(npugraph):
    y = torch_npu.npu_double(torch.ones(3, device="npu"))
    assert y.cpu().tolist() == [2.0, 2.0, 2.0]
    torch.sigmoid(y)
    kernels = [r for r in npugraph.trace.records if type(r).__name__ == "Kernel"]
    cores = {k.op.split("::")[-1]: k.cores for k in kernels}
    assert cores["npu_double"].kind == "AICPU" and not cores["npu_double"].limit_applies
    assert cores["sigmoid"].vector == 7

def test_missing_op_points_at_the_hook():
    with pytest.raises(AttributeError, match="npu_not_there.*pytest_npugraph_register_ops"):
        torch_npu.npu_not_there
""")
    result = run(pytester, "--npu-emulate=on", "-s")
    result.assert_outcomes(passed=2, failed=1)
    assert "HAZARDS SEEN [('test_race', 'race')]" in result.stdout.str()


ISOLATION = """
import sys
import unittest.mock
import pytest
import torch, torch_npu

@pytest.mark.parametrize("i", range(3))
def test_dirty(npugraph, i):
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, 3, 5)
    torch.npu.set_device_limit(0, 4, 8)
    torch.npu.set_stream(s)
    x = torch.ones(1024, device="npu")
    sys.modules["torch_npu"] = unittest.mock.MagicMock()
    torch.npu = unittest.mock.MagicMock()

@pytest.mark.parametrize("i", range(3))
def test_fresh(npugraph, i):
    import torch_npu as again
    assert again is torch_npu and torch.npu is torch_npu.npu
    assert torch.npu.current_stream() == torch.npu.default_stream()
    assert torch.npu.get_device_limit(0) == {"cube_core_num": 24, "vector_core_num": 48}
    assert torch.npu.get_stream_limit(torch.npu.Stream()) == {"cube_core_num": 24, "vector_core_num": 48}
    assert torch.npu.memory_allocated() == 0
    torch.npu.set_device_limit(0, 2, 4)       # once per test, not once per process
    assert len(npugraph.trace.records) < 10
"""


@pytest.mark.parametrize("order", [["-p", "no:randomly"], ["-p", "randomly", "--randomly-seed=1"],
                                   ["-p", "randomly", "--randomly-seed=2"]])
def test_no_state_leaks_between_tests_in_any_order(pytester, order):
    pytester.makepyfile(test_iso=ISOLATION)
    result = run(pytester, "--npu-emulate=on", *order, "-W", "ignore::UserWarning")
    result.assert_outcomes(passed=6)


def test_xdist_gives_the_same_outcomes(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_iso=ISOLATION, test_race=RACE)
    serial = run(pytester, "--npu-emulate=on", "-p", "no:randomly", "-W", "ignore::UserWarning")
    parallel = run(pytester, "--npu-emulate=on", "-n", "2", "-W", "ignore::UserWarning")
    serial.assert_outcomes(passed=6, failed=1)
    parallel.assert_outcomes(passed=6, failed=1)
    parallel.stdout.fnmatch_lines(["*npugraph hazards by kind*", "race *2 *test_race*"])


def test_timeline_writes_tracks_slices_flows_and_hazard_markers(pytester):
    pytester.makepyfile("""
        import json, re, torch, torch_npu
        def test_tl(npugraph, tmp_path):
            x = torch.ones(4, device="npu")
            s = torch.npu.Stream()
            e = torch.npu.Event()
            e.record()
            s.wait_event(e)
            with torch.npu.stream(s):
                y = x * 2
            with npugraph.expect("race"):
                z = y + 1
            npugraph.timeline(tmp_path / "t.json")
            ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
            tracks = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
            assert "npu:0/default" in tracks and any(re.fullmatch(r"npu:0/stream-0 \(made at test_\w+\.py:\d+\)", t)
                                                           for t in tracks), tracks
            slices = {e["name"]: e for e in ev if e["ph"] == "X"}
            assert slices["mul.Tensor"]["tid"] != slices["add.Tensor"]["tid"]
            assert slices["mul.Tensor"]["args"]["where"].endswith(":9")
            assert [e["ph"] for e in ev if e.get("cat") == "event"] == ["s", "f"]
            assert any(e["name"] == "HAZARD race" for e in ev if e["ph"] == "i")
    """)
    run(pytester, "--npu-emulate=on").assert_outcomes(passed=1)


def test_timeline_hazard_markers_carry_their_status(pytester):
    pytester.makepyfile(RACE.replace("    z = y + 1", "    with npugraph.expect('race', match='aten::add'):\n"
                                                    "        z = y + 1\n    npugraph.timeline('t.json')")
                        .replace("def test_race():", "def test_race(npugraph):"))
    run(pytester, "--npu-emulate=on").assert_outcomes(failed=1)
    import json
    marks = [e["args"]["status"] for e in json.loads((pytester.path / "t.json").read_text())["traceEvents"]
             if e.get("cat") == "hazard"]
    assert "expected" in marks and "failed" in marks
