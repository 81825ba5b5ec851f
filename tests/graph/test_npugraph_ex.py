"""The npugraph_ex backend (issue 12): ``torch.compile(model, backend="npugraph_ex", options={...})``
registered by ``import torch_npu``, ``torch.npu.npugraph_ex``, its options with their real names,
defaults and errors, capture per graph key and replay (reference torchair_api.md §2.7, §3.9, §4)."""
import os

import pytest
import torch
import torch_npu  # noqa: F401
from torch._dynamo.utils import counters

from .helpers import kernels


def ex(fn, dynamic=False, **options):
    return torch.compile(fn, backend="npugraph_ex", fullgraph=True, dynamic=dynamic,
                         **({"options": options} if options else {}))


# ------------------------------------------------------------------------ the surface
def test_import_torch_npu_registers_the_backend_with_dynamo():
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert "npugraph_ex" in list_backends(exclude_tags=())
    assert lookup_backend("npugraph_ex").__module__ == "torch_npu.utils._dynamo"


def test_public_modules_are_one_package():
    import npugraph_ex
    from torch_npu.dynamo import npugraph_ex as bundled

    assert bundled is npugraph_ex
    assert npugraph_ex.CompilerConfig is bundled.configs.compiler_config.CompilerConfig
    assert sorted(npugraph_ex.__all__) == sorted(["get_npu_backend", "get_compiler", "compile_fx", "CompilerConfig",
                                                  "logger", "register_replacement"])
    assert torch.npu.npugraph_ex.__all__ == ["compile_fx", "register_replacement"]
    assert torch.npu.npugraph_ex.scope.__all__ == ["limit_core_num", "deterministic"]
    assert callable(torch.npu.npugraph_ex.inference.cache_compile)


def test_config_defaults_and_bool_values():
    import npugraph_ex

    c = npugraph_ex.CompilerConfig()
    assert (c.force_eager.value, c.clone_input.value, c.clone_output.value, c.capture_limit.value,
            c.deadlock_check.value, c.mode.value, c.capture_error_mode.value, c.use_graph_pool) == (
        False, True, False, "64", False, "npugraph_ex", "global", None)
    assert c.inplace_pass.value is True and c.static_kernel_compile.value is False


@pytest.mark.parametrize("options, error, text", [
    ({"nope": 1}, ValueError, "Invalid option 'nope'. The 'CompilerConfig' object does not have attribute 'nope'. "
                              "Supported attributes are: ["),
    ({"clone_input": "yes"}, ValueError, "Value 'yes' (type: <class 'str'>) not in optional list [True, False] "
                                         "(type: <class 'bool'>)."),
    ({"capture_limit": 0}, ValueError, "Please set value in [1, 9223372036854775807], 0 is out of range."),
    ({"capture_limit": "8"}, ValueError, "Please set integer type, but got <class 'str'>"),
    ({"data_dump_dir": "/no/such/dir"}, FileNotFoundError, "Please set legal dir path, /no/such/dir is not found"),
    ({"super_kernel_optimize_options": [1]}, TypeError, "value must be dict or None, got <class 'list'>"),
    ({"capture_error_mode": "local"}, ValueError, "Value 'local' (type: <class 'str'>) not in optional list"),
])
def test_bad_options_raise_the_real_errors(npugraph, options, error, text):
    with pytest.raises(Exception) as info:
        ex(lambda x: x + 1, **options)(torch.ones(2, device="npu"))
    cause = getattr(info.value, "inner_exception", info.value)     # Dynamo's BackendCompilerFailed
    assert isinstance(cause, error) and text in str(cause)


def test_options_never_change_a_users_config(npugraph):
    import npugraph_ex

    c = npugraph_ex.CompilerConfig()
    backend = npugraph_ex.get_npu_backend(compiler_config=c)
    out = torch.compile(lambda x: x * 3, backend=backend, fullgraph=True, dynamic=False,
                        options={"clone_output": True, "capture_limit": 2})(torch.ones(2, device="npu"))
    assert out.cpu().tolist() == [3.0, 3.0]
    assert c.clone_output.value is False and c.capture_limit.value == "64"


# ---------------------------------------------------------------------- capture, replay
def test_first_call_captures_later_calls_replay(npugraph):
    step = ex(lambda x, w: torch.relu(x @ w) + 1)
    x, w = torch.randn(4, 8, device="npu"), torch.randn(8, 8, device="npu")
    outs = [step(x, w).cpu() for _ in range(3)]
    expected = torch.relu(x.cpu() @ w.cpu()) + 1
    assert all(torch.allclose(o, expected) for o in outs)
    (record,) = npugraph.graphs
    assert (record.mode, record.captures, record.replays, record.runs) == ("npugraph_ex", 1, 3, 3)
    assert counters["npugraph_ex"]["captured_graph_1"] == 1
    assert kernels(npugraph, "mm", graph="#replay3")
    npugraph.assert_clean()


def test_one_capture_per_graph_key_up_to_capture_limit_then_eager(npugraph):
    step = ex(lambda x: x * 2, dynamic=True, capture_limit=2)
    for n in (2, 3, 2):
        assert step(torch.ones(n, device="npu")).cpu().tolist() == [2.0] * n
    (record,) = npugraph.graphs
    assert record.captures == 2 and record.keys == ["[2]", "[3]"] and record.replays == 3
    with pytest.warns(UserWarning, match="static_capture_size_limit reached when capturing fx_graph graph_1 "
                                         "with graph key \\[4\\]"):
        assert step(torch.ones(4, device="npu")).cpu().tolist() == [2.0] * 4
    assert record.fallback_to_eager and record.replays == 3


def test_force_eager_runs_the_graph_without_capture(npugraph):
    step = ex(lambda x: x - 1, force_eager=True)
    assert step(torch.ones(2, device="npu")).cpu().tolist() == [0.0, 0.0]
    (record,) = npugraph.graphs
    assert record.captures == 0 and record.replays == 0 and record.runs == 1


def test_mutated_input_moving_recaptures(npugraph):
    def f(x, buf):
        buf.add_(x)
        return buf * 1

    step = ex(f)
    x = torch.ones(3, device="npu")
    a, b = torch.zeros(3, device="npu"), torch.zeros(3, device="npu")
    step(x, a)
    step(x, a)
    step(x, b)
    assert a.cpu().tolist() == [2.0] * 3 and b.cpu().tolist() == [1.0] * 3
    (record,) = npugraph.graphs
    assert record.recaptures == 1


def test_graph_pool_shared_by_use_graph_pool(npugraph):
    from pytest_npugraph import trace as T

    pool = torch.npu.graph_pool_handle()
    f = ex(lambda x: x + 1, use_graph_pool=pool)
    g = ex(lambda x: x * 2, use_graph_pool=pool)
    f(torch.ones(2, device="npu"))
    g(torch.ones(2, device="npu"))
    pools = {m.pool for m in npugraph.trace.records if isinstance(m, T.CaptureBegin)}
    assert pools == {str(pool)}


def test_compile_fx_compiles_an_aot_graph_with_options(npugraph):
    from torch._functorch.aot_autograd import aot_module_simplified

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=lambda g, i: torch.npu.npugraph_ex.compile_fx(
            g, i, options={"clone_output": True}))

    step = torch.compile(lambda x: x * 5, backend=backend, fullgraph=True, dynamic=False)
    kept = step(torch.ones(2, device="npu"))
    step(torch.zeros(2, device="npu"))
    assert kept.cpu().tolist() == [5.0, 5.0]       # clone_output: the kept output is the caller's
    npugraph.assert_clean()


def test_inference_cache_compile_takes_only_module_methods():
    # it was not emulated (NotImplementedError); now it compiles (tests/graph/test_torchair_surface.py)
    with pytest.raises(ValueError, match="Only method can be cached now"):
        torch.npu.npugraph_ex.inference.cache_compile(lambda x: x)


def test_scope_limit_core_num_eagerly_limits_the_current_stream(npugraph):
    stream = torch.npu.current_stream()
    before = torch.npu.get_stream_limit(stream)
    with torch.npu.npugraph_ex.scope.limit_core_num(4, 8):
        assert torch.npu.get_stream_limit(stream) == {"cube_core_num": 4, "vector_core_num": 8}
    assert torch.npu.get_stream_limit(stream) == before


def test_deterministic_level_is_checked():
    with pytest.raises(ValueError, match="deterministic level must be 0, 1, 2, or 3, got 5"):
        torch.npu.npugraph_ex.scope.deterministic(5)


def test_data_dump_dir_must_exist_but_a_real_one_is_accepted(npugraph, tmp_path):
    step = ex(lambda x: x + 2, data_dump_dir=os.fspath(tmp_path))
    assert step(torch.ones(1, device="npu")).cpu().tolist() == [3.0]


def test_deadlock_check_prints_torchairs_verdict_after_each_capture(npugraph, capsys):
    side = torch.npu.Stream()

    def f(x):
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            y = (x > 0).float().cumsum(0)          # not nonzero: its output shape is a host read, refused in a capture
        torch.npu.current_stream().wait_stream(side)
        return y

    step = ex(f, deadlock_check=True)
    step(torch.ones(4, device="npu"))
    step(torch.ones(4, device="npu"))
    assert capsys.readouterr().out.count("[RESULT] No deadlock risks detected.") == 1    # once per capture
    npugraph.assert_clean()


def test_no_deadlock_check_output_by_default(npugraph, capsys):
    ex(lambda x: x + 1)(torch.ones(2, device="npu"))
    assert "[RESULT]" not in capsys.readouterr().out
