"""Pinned host memory (issue 23 item 4): ``pin_memory=True`` factories, ``Tensor.pin_memory()`` and
``is_pinned()`` (torch's PrivateUse1 hooks cannot be provided by a Python backend: runtime/pinned.py)."""
import pytest
import torch
import torch_npu  # noqa: F401

FACTORIES = [
    lambda: torch.empty(3, pin_memory=True),
    lambda: torch.zeros(2, 3, pin_memory=True),
    lambda: torch.ones(4, dtype=torch.int32, pin_memory=True),
    lambda: torch.full((2,), 7.0, pin_memory=True),
    lambda: torch.tensor([1, 2, 3], pin_memory=True),
    lambda: torch.arange(5, pin_memory=True),
    lambda: torch.empty_strided((2, 2), (2, 1), pin_memory=True),
    lambda: torch.randn(3, pin_memory=True),
    lambda: torch.empty_like(torch.ones(2), pin_memory=True),
    lambda: torch.ones(1).new_zeros((2, 2), pin_memory=True),
]


@pytest.mark.parametrize("make", FACTORIES)
def test_pinned_factories_give_pinned_host_tensors(make):
    t = make()
    assert t.device.type == "cpu" and t.is_pinned()


def test_values_of_pinned_factories():
    assert torch.zeros(2, 3, pin_memory=True).sum().item() == 0
    assert torch.tensor([1, 2, 3], pin_memory=True).tolist() == [1, 2, 3]
    assert torch.full((2,), 7.0, pin_memory=True).tolist() == [7.0, 7.0]


def test_unpinned_stays_unpinned():
    assert not torch.zeros(3).is_pinned()
    assert not torch.zeros(3, pin_memory=False).is_pinned()
    assert not torch.ones(2, device="npu").is_pinned()


def test_pin_memory_copies_once_and_views_stay_pinned():
    x = torch.arange(6.0)
    p = x.pin_memory()
    assert p.is_pinned() and not x.is_pinned() and p.data_ptr() != x.data_ptr()
    assert p.pin_memory() is p
    assert p[2:].is_pinned() and p.view(2, 3).is_pinned()
    assert p.tolist() == x.tolist()


def test_pinning_a_device_tensor_is_refused():
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(2, device="npu").pin_memory()
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.empty(2, device="npu", pin_memory=True)


def test_model_runner_style_buffers_round_trip(npugraph):
    """vLLM's model runner: pinned host staging buffers copied to the device with non_blocking=True."""
    host = torch.zeros(8, dtype=torch.int32, pin_memory=True)
    host[:4] = torch.arange(4, dtype=torch.int32)
    dev = torch.empty(8, dtype=torch.int32, device="npu")
    dev.copy_(host, non_blocking=True)
    torch.npu.synchronize()
    assert dev.cpu().tolist() == [0, 1, 2, 3, 0, 0, 0, 0]
    npugraph.assert_clean()


def test_host_memory_stats_count_pinned_allocations():
    before = torch_npu.npu.host_memory_stats().get("allocation.current", 0)
    torch.empty(16, pin_memory=True)
    assert torch_npu.npu.host_memory_stats()["allocation.current"] == before + 1


def test_torchscript_still_compiles_the_wrapped_factories():
    """TorchScript resolves ``torch.zeros`` by identity: the pinned-aware wrappers are registered as the same ops."""
    @torch.jit.script
    def f(n: int):
        return torch.zeros(n) + torch.ones(n) + torch.arange(n)
    assert f(3).tolist() == [1.0, 2.0, 3.0]
