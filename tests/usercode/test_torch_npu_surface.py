"""The torch_npu modules and types vLLM-Ascend and SGLang import (issue 23 item 2), and the survey
tool that finds them (tools/survey_torch_npu_surface.py)."""
import importlib
import os
import pickle
import subprocess
import sys
import types
import warnings

import pytest
import torch
import torch_npu

from pytest_npugraph import trace as T

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("module", ["torch_npu.profiler", "torch_npu.profiler.dynamic_profile",
                                    "torch_npu.op_plugin.atb._atb_ops", "torch_npu.multiprocessing.reductions",
                                    "torch_npu._inductor"])
def test_modules_model_code_imports_exist(module):
    assert importlib.import_module(module).__name__ == module


def test_task_group_handle_is_the_type_graph_task_group_end_returns(npugraph):
    assert torch_npu._C._NPUTaskGroupHandle.__module__.startswith("torch_npu")
    s = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    x = torch.ones(4, device="npu")
    with torch.npu.graph(g, stream=s):
        torch.npu.graph_task_group_begin(s)
        y = x * 2
        handle = torch.npu.graph_task_group_end(s)
    assert isinstance(handle, torch_npu._C._NPUTaskGroupHandle)
    assert handle.task_group is not None
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 2.0))


def test_weak_ref_tensor_aliases_the_memory():
    x = torch.arange(6.0, device="npu").view(2, 3)
    w = torch_npu._C._weak_ref_tensor(x)
    assert w.data_ptr() == x.data_ptr() and w.shape == x.shape and w.stride() == x.stride()
    x.add_(1)
    torch.testing.assert_close(w.cpu(), torch.arange(1.0, 7.0).view(2, 3))
    with pytest.raises(TypeError, match="must be Tensor"):
        torch_npu._C._weak_ref_tensor([1])


@pytest.mark.npu_chip("Ascend910B3")
def test_soc_version_follows_the_chip():
    assert torch_npu.npu.get_soc_version() == 223


@pytest.mark.npu_chip("Ascend910_9391")
def test_soc_version_of_an_a3_chip():
    assert 250 <= torch.npu.get_soc_version() <= 255


def test_npu_only_dtypes_are_their_scalar_type_numbers():
    assert (torch_npu.int4, torch_npu.hifloat8, torch_npu.float8_e8m0fnu, torch_npu.float4_e2m1fn_x2,
            torch_npu.float4_e1m2fn_x2) == (285, 290, 293, 296, 297)
    assert repr(torch_npu.float4_e2m1fn_x2) == "torch_npu.float4_e2m1fn_x2"
    assert pickle.loads(pickle.dumps(torch_npu.hifloat8)) == 290


def test_atb_ops_module_binds_the_atb_names():
    from torch_npu.op_plugin.atb import _atb_ops

    assert "_npu_paged_attention" in _atb_ops.API_LIST and "npu_ring_mla" in _atb_ops.ATB_API_LIST
    assert _atb_ops.NNAL_EX is None
    _atb_ops._register_atb_extensions()
    assert torch_npu._npu_paged_attention is torch.ops.atb._npu_paged_attention
    assert torch_npu.atb.npu_ring_mla is torch.ops.atb.npu_ring_mla
    assert callable(_atb_ops._npu_paged_attention)


def test_profiler_runs_the_code_and_follows_the_schedule(npugraph):
    saved = []
    x = torch.ones(8, device="npu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = torch_npu.profiler._ExperimentalConfig(export_type=torch_npu.profiler.ExportType.Text,
                                                        profiler_level=torch_npu.profiler.ProfilerLevel.Level1,
                                                        aic_metrics=torch_npu.profiler.AiCMetrics.PipeUtilization)
        prof = torch_npu.profiler.profile(
            activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
            schedule=torch_npu.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=saved.append, experimental_config=config)
    with prof as p:
        for _ in range(6):
            x = x * 2
            p.step()
    torch.testing.assert_close(x.cpu(), torch.full((8,), 64.0))
    # steps 0 wait, 1 warmup, 2-3 active (3 saves), then no more cycles
    assert saved == [prof]
    assert len(prof.prof_if.windows) == 1
    first, last = prof.prof_if.windows[0]
    kernels = [r for r in npugraph.trace.records[first:last] if isinstance(r, T.Kernel)]
    assert len(kernels) == 3      # the multiplications of steps 1 (warmup), 2 and 3


def test_profiler_without_schedule_saves_once_at_stop():
    saved = []
    with torch_npu.profiler.profile(on_trace_ready=saved.append) as p:
        torch.ones(2, device="npu").add_(1)
    assert saved == [p]


def test_tensorboard_trace_handler_writes_the_trace_view(tmp_path):
    import json

    with torch_npu.profiler.profile(on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(tmp_path))):
        torch.ones(2, device="npu").mul_(3)
    (run,) = os.listdir(tmp_path)
    assert run.endswith("_ascend_pt")
    with open(tmp_path / run / "ASCEND_PROFILER_OUTPUT" / "trace_view.json") as f:
        events = json.load(f)["traceEvents"]
    assert any("mul" in str(e.get("name", "")) for e in events)


def test_profiler_schedule_rejects_negative_steps():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = torch_npu.profiler.schedule(wait=0, active=1)
    with pytest.raises(ValueError, match="must be not less than 0"):
        s(-1)
    assert torch_npu.profiler.supported_activities() == {torch_npu.profiler.ProfilerActivity.CPU,
                                                         torch_npu.profiler.ProfilerActivity.NPU}


def test_dynamic_profile_step_counts():
    from torch_npu.profiler import dynamic_profile as dp

    before = dp._state["step"]
    dp.step()
    assert dp._state["step"] == before + 1


def test_rebuild_npu_tensor_round_trip_through_pickle_protocol():
    from torch_npu.multiprocessing import reductions

    x = torch.arange(12.0, device="npu").view(3, 4)[:, 1:3]
    rebuild, args = reductions._npu_reduce_tensor(x)
    assert rebuild is reductions.rebuild_npu_tensor and len(args) == 15
    y = rebuild(*args)
    assert y.device == x.device and y.shape == x.shape and y.stride() == x.stride()
    torch.testing.assert_close(y.cpu(), x.cpu())
    assert y.data_ptr() != x.data_ptr()     # a block of the consumer's device


def test_rebuild_npu_tensor_in_another_process(tmp_path):
    """The handle names shared memory another process can map (what weight-transfer engines do)."""
    from torch_npu.multiprocessing import reductions

    x = torch.arange(5, dtype=torch.int32, device="npu") * 7
    _, args = reductions._npu_reduce_tensor(x)
    script = tmp_path / "consumer.py"
    script.write_text(
        "from pytest_npugraph import activation\n"
        "activation.activate()   # the emulated packages (the plugin does this for the processes of a test)\n"
        "import pickle, sys, torch, torch_npu\n"
        "from torch_npu.multiprocessing.reductions import rebuild_npu_tensor\n"
        "args = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
        "t = rebuild_npu_tensor(*args)\n"
        "print(t.device, t.cpu().tolist())\n")
    out = subprocess.run([sys.executable, str(script), pickle.dumps(args).hex()], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["npu:0", "[0,", "7,", "14,", "21,", "28]"]


def test_mem_pool_routes_allocations_of_the_thread():
    pool = torch.npu.MemPool()
    assert isinstance(pool.id, tuple) and len(pool.id) == 2
    with torch.npu.use_mem_pool(pool):
        a = torch.empty(1024, device="npu")
        assert pool.use_count() == 2
    b = torch.empty(1024, device="npu")
    in_pool = {s["address"] for s in pool.snapshot()}
    assert any(s["address"] <= a.data_ptr() < s["address"] + s["total_size"] for s in pool.snapshot())
    assert not any(s["address"] <= b.data_ptr() < s["address"] + s["total_size"] for s in pool.snapshot())
    assert in_pool and pool.use_count() == 1


def test_npu_graph_handler_registry_and_update_args():
    from torch_npu.npu._npugraph_handlers import _NPU_GRAPH_OP_HANDLERS

    @torch.npu.register_npu_graph_handler(["my_op.default"])
    class Handler(torch.npu.NpuGraphOpHandler):
        UPDATE_SPECS = {"my_op.default": [("arg", 1, "seq_lens"), ("kwarg", "scale", "scale")]}

    class Record:
        op_cache_entry = types.SimpleNamespace(__name__="my_op.default")

        def __init__(self):
            self.args, self.kwargs = ["q", [1, 2]], {"scale": 1.0}

    try:
        assert _NPU_GRAPH_OP_HANDLERS["my_op.default"] is Handler
        r = Record()
        Handler.update_args(r, {"seq_lens": [3, 4], "scale": 0.5})
        assert r.args == ["q", [3, 4]] and r.kwargs == {"scale": 0.5}
        with pytest.raises(TypeError):
            torch.npu.register_npu_graph_handler("x")(object)
    finally:
        _NPU_GRAPH_OP_HANDLERS.pop("my_op.default", None)


def test_survey_tool_counts_used_and_missing_names(tmp_path):
    src = tmp_path / "pkg"
    src.mkdir()
    (src / "a.py").write_text(
        "import torch\nimport torch_npu\nfrom torch_npu.profiler import dynamic_profile as dp\n"
        "h: torch_npu._C._NPUTaskGroupHandle\n"
        "torch.npu.config.allow_internal_format = True\n"
        "torch_npu.not_a_real_name\n"
        "torch.ops.npu.some_other_package_op(1)\n"
        "if hasattr(torch_npu, 'probe'): pass\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "survey_torch_npu_surface.py"), str(src),
                          "--missing"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].startswith("names used: 6 (6 uses); missing: 1 (1 uses); ops of other packages in "
                               "torch.ops.npu: 1 (1 uses)"), out.stdout
    assert any("torch_npu.not_a_real_name" in line for line in lines)
    assert any("torch.ops.npu.some_other_package_op" in line for line in lines)


def test_profiler_parameter_warnings_are_printed_as_torch_npu_prints_them(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # a suite run with -W error is not broken by them
        torch_npu.profiler.schedule(wait=-1, active=1)
    out = capsys.readouterr().out
    assert "[WARNING]" in out and "profiler.py: Invalid parameter wait, reset it to 0." in out
