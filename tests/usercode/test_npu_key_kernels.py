"""Kernels user code registers for the npu dispatch key run with the NPU tensors (issue 23 item 1).

Why: vLLM-Ascend registers 18 custom ops with ``torch.library`` for ``PrivateUse1``
(``maybe_chunk_residual``, ``npu_rotary_embedding``, ``quantize``, ``muls_add``...).  The emulator
used to call such an op with the CPU payloads, which failed "Could not run ... with arguments from
the 'CPU' backend".  As on hardware the kernel must get the NPU tensors, so the ops it calls are
dispatched, recorded and checked (a race inside it is reported), in eager code and in compiled
regions (where the user's fake kernel is used while tracing).  Every registration style vLLM and
vLLM-Ascend use is covered.
"""
import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.trace import Kernel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _ops(npugraph):
    return [r.op for r in npugraph.trace.records if isinstance(r, Kernel)]


def direct_register_custom_op(lib, op_name, op_func, mutates_args=(), fake_impl=None, dispatch_key="PrivateUse1"):
    """vLLM's ``vllm.utils.direct_register_custom_op`` (what vLLM-Ascend registers its ops with)."""
    schema_str = torch.library.infer_schema(op_func, mutates_args=mutates_args)
    lib.define(op_name + schema_str)
    lib.impl(op_name, op_func, dispatch_key=dispatch_key)
    if fake_impl is not None:
        lib._register_fake(op_name, fake_impl)


@pytest.fixture
def lib():
    """A fresh op namespace per test (the registrations go with the Library)."""
    lib = torch.library.Library("npugraph_user_ops", "FRAGMENT")
    yield lib
    lib._destroy()


def test_library_impl_for_privateuse1_runs_with_npu_tensors(npugraph, lib):
    seen = []

    def twice(x):
        seen.append((type(x).__name__, x.device))
        return x * 2

    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", twice, "PrivateUse1")
    y = torch.ops.npugraph_user_ops.twice(torch.ones(2, device="npu"))
    assert y.device == torch.device("npu", 0) and y.cpu().tolist() == [2.0, 2.0]
    assert seen == [("NpuTensor", torch.device("npu", 0))]
    assert "aten::mul.Tensor" in _ops(npugraph)       # the op inside is an NPU task of its own
    npugraph.assert_clean()


def test_torch_library_impl_with_the_npu_device_type(npugraph, lib):
    torch.library.define("npugraph_user_ops::plus_one", "(Tensor x) -> Tensor", lib=lib)
    torch.library.impl("npugraph_user_ops::plus_one", "npu", lambda x: x + 1, lib=lib)
    y = torch.ops.npugraph_user_ops.plus_one(torch.zeros(3, device="npu"))
    assert y.cpu().tolist() == [1.0, 1.0, 1.0]
    assert "aten::add.Tensor" in _ops(npugraph)
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_custom_op_with_device_types_npu_on_npu1(npugraph):
    @torch.library.custom_op("npugraph_user_ops::scale_by", mutates_args=(), device_types="npu")
    def scale_by(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x * factor

    try:
        x = torch.arange(4.0, device="npu:1")
        y = scale_by(x, 3.0)
        assert y.device == torch.device("npu", 1)
        assert y.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]
        (mul,) = [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.op == "aten::mul.Tensor"]
        assert npugraph.trace.streams[mul.stream].device == 1
    finally:
        scale_by._lib._destroy()
    npugraph.assert_clean()


def test_vllm_direct_register_custom_op_in_place(npugraph, lib):
    """vLLM-Ascend's style: an op mutating its argument, registered for PrivateUse1 with a fake kernel."""
    def muls_add_(x: torch.Tensor, y: torch.Tensor, scale: float) -> None:
        x.mul_(scale).add_(y)

    direct_register_custom_op(lib, "muls_add_", muls_add_, mutates_args=["x"], fake_impl=lambda x, y, scale: None)
    x = torch.ones(4, device="npu")
    torch.ops.npugraph_user_ops.muls_add_(x, torch.arange(4.0, device="npu"), 2.0)
    assert x.cpu().tolist() == [2.0, 3.0, 4.0, 5.0]
    assert {"aten::mul_.Tensor", "aten::add_.Tensor"} <= set(_ops(npugraph))
    npugraph.assert_clean()


def test_vllm_direct_register_custom_op_returning_views(npugraph, lib):
    """``maybe_chunk_residual``'s shape: the kernel returns a slice of its input."""
    def maybe_chunk_residual(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if x.size(0) != residual.size(0):
            return residual[:x.size(0)].clone()
        return residual.clone()

    direct_register_custom_op(lib, "maybe_chunk_residual", maybe_chunk_residual,
                              fake_impl=lambda x, residual: residual[:x.size(0)].clone())
    out = torch.ops.npugraph_user_ops.maybe_chunk_residual(torch.ones(2, 3, device="npu"),
                                                           torch.arange(12.0, device="npu").view(4, 3))
    assert out.shape == (2, 3) and out.cpu().flatten().tolist() == [float(i) for i in range(6)]
    npugraph.assert_clean()


def test_autograd_and_composite_registrations_for_npu(npugraph, lib):
    lib.define("grad_twice(Tensor x) -> Tensor")
    lib.impl("grad_twice", lambda x: x * 2, "AutogradPrivateUse1")
    lib.define("composite_cube(Tensor x) -> Tensor")
    lib.impl("composite_cube", lambda x: x * x * x, "CompositeImplicitAutograd")
    x = torch.full((2,), 3.0, device="npu", requires_grad=True)
    y = torch.ops.npugraph_user_ops.grad_twice(x)
    z = torch.ops.npugraph_user_ops.composite_cube(x)
    assert y.detach().cpu().tolist() == [6.0, 6.0] and z.detach().cpu().tolist() == [27.0, 27.0]
    z.sum().backward()
    assert x.grad.cpu().tolist() == [27.0, 27.0]      # d(x^3)/dx through the composite's own ops
    npugraph.assert_clean()


def test_an_op_with_only_a_cpu_kernel_still_runs_on_the_payloads(npugraph, lib):
    lib.define("cpu_only(Tensor x) -> Tensor")
    lib.impl("cpu_only", lambda x: x + 10, "CPU")
    y = torch.ops.npugraph_user_ops.cpu_only(torch.ones(2, device="npu"))
    assert y.device.type == "npu" and y.cpu().tolist() == [11.0, 11.0]
    assert "npugraph_user_ops::cpu_only" in _ops(npugraph)      # one task, named for the op
    npugraph.assert_clean()


# ------------------------------------------------------------------ checked inside
def _side_stream_kernel(synchronised):
    def kernel(x):
        y = x * 2
        side = torch.npu.Stream()
        if synchronised:
            side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            y.add_(1)
        if synchronised:
            torch.npu.current_stream().wait_stream(side)
            y.record_stream(side)
        return y
    return kernel


def test_a_race_inside_an_npu_key_kernel_is_reported(npugraph, lib):
    lib.define("racy(Tensor x) -> Tensor")
    lib.impl("racy", _side_stream_kernel(synchronised=False), "PrivateUse1")
    with npugraph.expect("race", match="add_"):
        torch.ops.npugraph_user_ops.racy(torch.ones(4, device="npu")).cpu()


def test_the_synchronised_kernel_is_clean(npugraph, lib):
    lib.define("synced(Tensor x) -> Tensor")
    lib.impl("synced", _side_stream_kernel(synchronised=True), "PrivateUse1")
    y = torch.ops.npugraph_user_ops.synced(torch.ones(4, device="npu"))
    assert y.cpu().tolist() == [3.0] * 4
    npugraph.assert_clean()


# ------------------------------------------------------------------ compiled regions
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "npu", "npugraph_ex"])
def test_in_compiled_regions_the_fake_kernel_traces_and_the_npu_kernel_runs(npugraph, lib, backend):
    calls = {"fake": 0, "npu": 0}

    def fake(x):
        calls["fake"] += 1
        return torch.empty_like(x)

    def npu_kernel(x):
        calls["npu"] += 1
        return x * 2 + 1

    lib.define("twice_plus_one(Tensor x) -> Tensor")
    lib.impl("twice_plus_one", npu_kernel, "PrivateUse1")
    lib._register_fake("twice_plus_one", fake)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.ops.npugraph_user_ops.twice_plus_one(x) - 1, backend=backend)
    out = fn(torch.arange(3.0, device="npu"))
    assert out.cpu().tolist() == [0.0, 2.0, 4.0]
    assert calls["fake"] >= 1 and calls["npu"] == 1
    assert "aten::mul.Tensor" in _ops(npugraph)
    torch._dynamo.reset()
    npugraph.assert_clean()


def test_a_kernel_registered_or_removed_between_calls_is_noticed(npugraph, lib):
    """The dispatch core asks on every call (a set lookup), not once per op."""
    lib.define("late(Tensor x) -> Tensor")
    lib.impl("late", lambda x: x + 10, "CPU")
    x = torch.ones(2, device="npu")
    assert torch.ops.npugraph_user_ops.late(x).cpu().tolist() == [11.0, 11.0]
    npu_lib = torch.library.Library("npugraph_user_ops", "FRAGMENT")
    npu_lib.impl("late", lambda x: x * 5, "PrivateUse1")
    assert torch.ops.npugraph_user_ops.late(x).cpu().tolist() == [5.0, 5.0]
    npu_lib._destroy()
    assert torch.ops.npugraph_user_ops.late(x).cpu().tolist() == [11.0, 11.0]
    npugraph.assert_clean()
