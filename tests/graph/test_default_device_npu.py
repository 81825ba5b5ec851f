"""Compiled code under ``torch.set_default_device("npu")``: Dynamo calls tensor methods through the
device's torch function mode with the function ``torch.Tensor.<name>`` itself, which for ``to`` and
``new_tensor`` is the emulator's bare-device wrapper (runtime/backend.py); it must stay in the graph as
the method does, not break the graph (a break inside a stream scope loses the scope's exit)."""
import pytest
import torch
import torch_npu  # noqa: F401
import torchair

from graph.helpers import backend


@pytest.fixture
def default_npu():
    torch.set_default_device("npu")
    yield
    torch.set_default_device(None)


def _cast_in_a_stream_scope(x):
    y = x * 2
    with torchair.scope.npu_stream_switch("2", 3):
        torchair.ops.wait([y])
        z = y.view(-1).to(torch.float32) + 1
    return z, y.new_tensor([1.0, 2.0])


def test_tensor_to_and_new_tensor_do_not_break_the_graph(default_npu):
    x = torch.ones(2, 2, dtype=torch.float16, device="npu")
    explained = torch._dynamo.explain(_cast_in_a_stream_scope)(x)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]


def test_a_cast_in_a_stream_scope_compiles_and_computes(default_npu):
    """GE mode (it orders the cross-stream edges itself; in reduce-overhead this code would need tagged
    events and npu_record_tagged_stream)."""
    config = torchair.CompilerConfig()
    config.mode = "max-autotune"
    fn = torch.compile(_cast_in_a_stream_scope, backend=torchair.get_npu_backend(compiler_config=config))
    x = torch.ones(2, 2, dtype=torch.float16, device="npu")
    z, t = fn(x)
    assert z.dtype == torch.float32 and z.device.type == "npu"
    assert torch.equal(z.cpu(), torch.full((4,), 3.0, device="cpu"))
    assert t.device.type == "npu" and t.dtype == torch.float16 and t.cpu().tolist() == [1.0, 2.0]


def _scale_by_sizes(x):
    h = float(x.size(-1))
    n = int(x.size(0))
    return x * h + n, torch.tensor(h) + torch.ones(n)


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead", "npugraph_ex"])
def test_dynamic_sizes_become_python_numbers_under_the_default_device(default_npu, mode):
    """``float(x.size(-1))`` / ``int(...)`` of a symbolic size in a dynamic-shape graph (issue 25: it crashed
    with "'NoneType' object has no attribute 'item'" under ``set_default_device("npu")``)."""
    fn = torch.compile(_scale_by_sizes, backend=backend(mode), dynamic=True)
    for rows, cols in ((2, 3), (4, 5)):
        x = torch.ones(rows, cols, device="npu")
        y, t = fn(x)
        assert y.device.type == "npu" and t.device.type == "npu"       # torch.tensor/ones follow the default
        assert torch.equal(y.cpu(), torch.full((rows, cols), float(cols + rows), device="cpu"))
        assert torch.equal(t.cpu(), torch.full((rows,), cols + 1.0, device="cpu"))
