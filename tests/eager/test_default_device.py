"""``torch.set_default_device("npu")`` (and ``with torch.device("npu")``) sends the factories there, as
with torch_npu: the plugin's ``pin_memory`` wrappers of ``torch.ones``... had hidden the builtins from
torch's default-device mode, so ``torch.ones(2)`` stayed on the CPU."""
import pytest
import torch
import torch_npu  # noqa: F401

from graph.helpers import backend


@pytest.fixture
def default_npu():
    torch.set_default_device("npu")
    yield
    torch.set_default_device(None)


@pytest.mark.parametrize("make", [
    lambda: torch.ones(2), lambda: torch.zeros(2, 3), lambda: torch.empty(4), lambda: torch.full((2,), 7.0),
    lambda: torch.tensor([1, 2]), lambda: torch.arange(3), lambda: torch.randn(2), lambda: torch.eye(2),
    lambda: torch.linspace(0, 1, 5), lambda: torch.randint(0, 5, (3,)),
], ids=["ones", "zeros", "empty", "full", "tensor", "arange", "randn", "eye", "linspace", "randint"])
def test_factories_follow_the_default_device(default_npu, make):
    assert make().device == torch.device("npu:0")


def test_explicit_device_and_like_factories_keep_theirs(default_npu):
    assert torch.ones(2, device="cpu").device.type == "cpu"
    assert torch.zeros_like(torch.ones(2, device="cpu")).device.type == "cpu"
    assert torch.ones(2, pin_memory=True, device="cpu").is_pinned()


@pytest.mark.npu_devices(2)
def test_the_default_npu_is_the_current_device(npugraph):
    torch.npu.set_device(1)
    with torch.device("npu"):
        x = torch.ones(2) * 3
    assert x.device == torch.device("npu:1")
    assert x.cpu().tolist() == [3.0, 3.0]


def test_without_a_default_device_factories_stay_on_the_cpu():
    assert torch.ones(2).device.type == "cpu"
    with torch.device("cpu"):
        assert torch.ones(2).device.type == "cpu"


@pytest.mark.parametrize("mode", ["aot_eager", "max-autotune", "reduce-overhead"])
def test_factories_in_compiled_code_follow_the_default_device(default_npu, mode):
    def f(x):
        return x + torch.ones(2) + torch.arange(2)

    fn = torch.compile(f, backend="aot_eager" if mode == "aot_eager" else backend(mode), fullgraph=True)
    x = torch.ones(2)
    for _ in range(2):
        out = fn(x)
    assert out.device == torch.device("npu:0") and out.cpu().tolist() == [2.0, 3.0]
