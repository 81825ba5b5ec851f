"""``python -m pytest_npugraph run SCRIPT`` (issue 28): a plain script under the emulator, the hazard report
at exit and an exit status that says whether it found one.

Why: seed documents, TorchAir's samples and users' own checks are scripts; they get the same emulator and
checks as tests, with nothing to write but the command.  Each test runs the command once (a process that
imports torch: seconds).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.npu_no_inherit      # the command's processes are its own, not this test's children

RACY = textwrap.dedent("""
    import torch
    import torch_npu

    side = torch.npu.Stream()
    x = torch.ones(8).npu()
    x.mul_(2)                                        # line 7: the main stream writes x
    with torch.npu.stream(side):
        y = x + 1                                    # line 9: the side stream reads it
    torch.npu.current_stream().wait_stream(side)
    print("total", y.sum().item(), torch.npu.get_device_properties(0).name)
""")
FIXED = RACY.replace("with torch.npu.stream(side):", "side.wait_stream(torch.npu.current_stream())\n"
                     "with torch.npu.stream(side):")

RANKS = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    import torch_npu

    rank = int(os.environ["RANK"])
    torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("hccl")
    t = torch.full((2,), float(rank + 1)).npu()
    dist.all_reduce(t)
    out = torch.zeros(2).npu()
    if rank == 0:
        dist.send(t * 10, dst=1)
    else:
        dist.recv(out, src=0)
    print(f"rank {rank}", t.cpu().tolist(), out.cpu().tolist(), flush=True)
    dist.destroy_process_group()
""")


def run(tmp_path, source, *options):
    script = tmp_path / "script.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("NPUGRAPH_CHILD",)}
    return subprocess.run([sys.executable, "-m", "pytest_npugraph", "run", *options, str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env=env)


def test_a_racy_script_exits_nonzero_and_names_the_race_lines(tmp_path):
    done = run(tmp_path, RACY, "--chip", "Ascend910B3", "--trace", "timeline.json")
    assert done.returncode == 1, done.stderr
    assert "total 24.0 Ascend910B3" in done.stdout
    assert "--- 1. race ---" in done.stderr
    assert "aten::add.Tensor at script.py:9" in done.stderr and "aten::mul_.Tensor at script.py:7" in done.stderr
    events = json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    assert any(e.get("name") == "mul_.Tensor" for e in events)


def test_the_fixed_script_exits_0_with_its_output(tmp_path):
    done = run(tmp_path, FIXED, "--html", "report.html")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "total 24.0 Ascend910B1"
    assert "npugraph: no hazards" in done.stderr
    assert "pytest-npugraph report" in (tmp_path / "report.html").read_text()


def test_nproc_per_node_runs_a_multi_rank_script_with_torchrun_env(tmp_path):
    done = run(tmp_path, RANKS, "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.strip().splitlines()) == ["rank 0 [3.0, 3.0] [0.0, 0.0]",
                                                        "rank 1 [3.0, 3.0] [30.0, 30.0]"]
    assert "2 device(s)" in done.stderr and "npugraph: no hazards" in done.stderr


def test_an_unreceived_send_fails_the_script_as_a_deadlock(tmp_path):
    done = run(tmp_path, RANKS.replace("dist.recv(out, src=0)", "pass"), "--nproc-per-node", "2")
    assert done.returncode != 0
    assert "--- 1. deadlock ---" in done.stderr and "npu:1, which never issues it" in done.stderr


def test_the_console_script_is_declared():
    import tomllib

    from pytest_npugraph import cli

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    module, _, name = scripts["pytest-npugraph"].partition(":")
    assert module == "pytest_npugraph.cli" and getattr(cli, name) is cli.main
