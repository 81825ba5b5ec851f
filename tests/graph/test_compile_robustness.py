"""torch.compile on ordinary NPU code, with every backend model code uses (Dynamo's eager and
aot_eager, TorchAir's GE and reduce-overhead modes): device factories inside the region, views of
NPU tensors as inputs, data-dependent graph breaks, graphs without outputs, custom ops (docs/reference.md, "Install and activation")."""
import pytest
import torch
import torch_npu
import torchair

from pytest_npugraph import trace as T

from .helpers import config

BACKENDS = ["eager", "aot_eager", "max-autotune", "reduce-overhead"]


def compiled(fn, backend):
    if backend in ("eager", "aot_eager"):
        return torch.compile(fn, backend=backend)
    return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config(backend)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_factories_with_an_npu_device_inside_the_region(backend, npugraph):
    def f(x):
        a = torch.tensor([1.0, 2.0], device=x.device)        # lifted constant, copied to the device
        b = torch.zeros(2, device="npu") + torch.arange(2, device="npu")
        c = torch.ones(2).to("npu")
        return x + a + b + c

    x = torch.ones(2, device="npu")
    out = compiled(f, backend)(x)
    assert out.device == x.device and out.cpu().tolist() == [3.0, 5.0]
    npugraph.assert_clean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_npu_constants_in_the_region(backend, npugraph):
    """One-element and empty tensors are constant-propagated while tracing: their fakes keep the
    real NPU tensor as constant."""
    def f(x):
        scale = torch.tensor(2.0, device=x.device)
        nothing = torch.tensor([], dtype=torch.float32, device=x.device)
        return x * scale + nothing.sum() + scale.item()

    assert compiled(f, backend)(torch.ones(2, device="npu")).cpu().tolist() == [4.0, 4.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_factory_in_a_region_compiled_in_another_thread(backend, npugraph):
    """Threads do not share torch's lift setting: the fallback lifts the host data the same way."""
    import threading

    def f(x):
        return x * torch.tensor([2.0, 3.0], device=x.device)

    got = []

    def run():
        got.append(compiled(f, backend)(torch.ones(2, device="npu")).cpu().tolist())
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert got == [[2.0, 3.0]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", ["slice", "t", "unsqueeze"])
def test_a_view_of_an_npu_tensor_as_input(backend, view, npugraph):
    base = torch.arange(12.0, device="npu").reshape(3, 4).contiguous().clone()
    make = {"slice": lambda b: b[1:], "t": lambda b: b.t(), "unsqueeze": lambda b: b.unsqueeze(0)}[view]
    x = make(base)
    assert x._is_view() and x._base is base          # still a view in eager code
    out = compiled(lambda x: x * 2, backend)(x)
    assert torch.equal(out.cpu(), make(base.cpu()) * 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_and_its_base_as_inputs_share_memory_in_the_graph(backend, npugraph):
    base = torch.zeros(3, 4, device="npu")

    def f(base, view):
        view.add_(1)                  # visible through base inside the graph and after it
        return base * 2

    out = compiled(f, backend)(base, base[1:])
    assert base.cpu().sum().item() == 8 and out.cpu().sum().item() == 16


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_data_dependent_branch_breaks_the_graph_and_runs_eagerly(backend, npugraph):
    def f(x):
        y = x * 2
        if y.sum() < 0:               # graph break: a host read of a device value
            return y - 1
        return y + 1

    g = compiled(f, backend)
    assert g(torch.ones(2, device="npu")).cpu().tolist() == [3.0, 3.0]
    assert g(-torch.ones(2, device="npu")).cpu().tolist() == [-3.0, -3.0]
    reads = [r for r in npugraph.trace.records if isinstance(r, T.HostSync) and r.what == "read"]
    assert len(reads) >= 2, "each call's branch reads the sum on the host"
    npugraph.assert_clean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_item_inside_a_compiled_function(backend, npugraph):
    def f(x):
        n = x.sum().item()
        return x * n

    assert compiled(f, backend)(torch.ones(2, device="npu")).cpu().tolist() == [2.0, 2.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_graphs_with_no_output(backend, npugraph):
    def mutate(x):
        x.add_(1)

    x = torch.ones(2, device="npu")
    assert compiled(mutate, backend)(x) is None
    assert x.cpu().tolist() == [2.0, 2.0]
    assert compiled(lambda x: None, backend)(x) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_ops_trace_in_a_compiled_region(backend, npugraph):
    x = torch.randn(2, 4, 8, device="npu")
    w = torch.ones(8, device="npu")
    cos, sin = torch.randn(1, 4, 1, 8, device="npu"), torch.randn(1, 4, 1, 8, device="npu")

    def f(x):
        y = torch_npu.npu_rms_norm(x, w)[0]
        q = torch_npu.npu_rotary_mul(y.view(2, 4, 1, 8), cos, sin)
        weights, experts, rows = torch_npu.npu_moe_gating_top_k_softmax(q.view(8, 8), None, k=2)
        return torch_npu.npu_swiglu(q, dim=-1), weights, experts, rows

    expected = f(x)
    got = compiled(f, backend)(x)
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype and torch.allclose(e.cpu(), g.cpu())


def test_eager_npu_code_never_imports_dynamo(pytester):
    """The guard keeping Dynamo out of the backend uses torch's C hooks only."""
    pytester.makepyfile("""
        import sys, torch, torch_npu

        def test_it():
            x = torch.ones(2, device="npu")
            y = torch.tensor([1.0, 2.0], device="npu")
            assert (x + y).sum().item() == 5.0
            assert "torch._dynamo" not in sys.modules
    """)
    pytester.runpytest_subprocess("--npu-emulate=on", "-p", "no:randomly").assert_outcomes(passed=1)
