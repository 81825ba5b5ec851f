"""NPU tensors look like NPU tensors: devices, factories, moves, modules, views, compile (docs/reference.md, "Install and activation")."""
import pytest
import torch
import torch_npu  # noqa: F401

NPU0 = torch.device("npu", 0)
NPU1 = torch.device("npu", 1)


def test_torch_device_npu(npugraph):
    assert torch.device("npu").type == "npu" and torch.device("npu").index is None
    assert torch.device("npu:1") == NPU1 == torch.device("npu", 1)
    assert torch._C._get_privateuse1_backend_name() == "npu"


@pytest.mark.parametrize("move", [
    lambda t: t.npu(), lambda t: t.npu(0), lambda t: t.npu("npu"), lambda t: t.npu(torch.device("npu:0")),
    lambda t: t.to("npu"), lambda t: t.to("npu:0"), lambda t: t.to(NPU0), lambda t: t.to(device="npu"),
])
def test_moves_to_the_current_npu(npugraph, move):
    cpu = torch.arange(6.0).reshape(2, 3)
    x = move(cpu)
    assert x.device == NPU0 and x.device.type == "npu" and x.is_npu
    assert not cpu.is_npu
    assert x.shape == (2, 3) and x.dtype == torch.float32
    assert torch.equal(x.cpu(), cpu)


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("move", [lambda t: t.npu(1), lambda t: t.to("npu:1"), lambda t: t.to(NPU1)])
def test_moves_to_npu_1(npugraph, move):
    x = move(torch.tensor([1.0, 2.0]))
    assert x.device == NPU1
    assert x.cpu().tolist() == [1.0, 2.0]


@pytest.mark.npu_devices(2)
def test_npu_without_index_follows_the_current_device(npugraph):
    torch.npu.set_device(1)
    assert torch.ones(1).npu().device == NPU1
    assert torch.ones(1).to("npu").device == NPU1
    assert torch.zeros(1, device="npu").device == NPU1
    assert torch.ones(1).to(device=torch.device("npu")).device == NPU1
    assert torch.nn.Linear(2, 2).to("npu").weight.device == NPU1
    assert torch.ones(1).to("npu:0").device == NPU0


@pytest.mark.parametrize("bad", ["cpu", torch.device("cpu"), "cuda:0"])
def test_tensor_npu_rejects_other_devices(npugraph, bad):
    with pytest.raises(RuntimeError, match="^Invalid device, must be npu device"):
        torch.ones(2).npu(bad)


@pytest.mark.parametrize("make, expected", [
    (lambda d: torch.ones(2, 2, device=d), [[1.0, 1.0], [1.0, 1.0]]),
    (lambda d: torch.zeros(3, device=d), [0.0, 0.0, 0.0]),
    (lambda d: torch.full((2,), 7.0, device=d), [7.0, 7.0]),
    (lambda d: torch.arange(4, device=d), [0, 1, 2, 3]),
    (lambda d: torch.arange(1.0, 2.0, 0.5, device=d), [1.0, 1.5]),
    (lambda d: torch.tensor([[1, 2], [3, 4]], device=d), [[1, 2], [3, 4]]),
    (lambda d: torch.tensor(5.0, device=d), 5.0),
    (lambda d: torch.as_tensor([1.5, 2.5], device=d), [1.5, 2.5]),
    (lambda d: torch.eye(2, device=d), [[1.0, 0.0], [0.0, 1.0]]),
    (lambda d: torch.linspace(0, 1, 3, device=d), [0.0, 0.5, 1.0]),
])
@pytest.mark.parametrize("device", ["npu", "npu:0", NPU0])
def test_factories_with_device(npugraph, make, expected, device):
    x = make(device)
    assert x.device == NPU0 and x.is_npu
    assert x.cpu().tolist() == expected
    assert x.shape == torch.tensor(expected).shape


@pytest.mark.parametrize("make", [
    lambda: torch.empty(2, 3, device="npu"), lambda: torch.randn(2, 3, device="npu"),
    lambda: torch.rand(2, 3, device="npu"), lambda: torch.empty_strided((2, 3), (1, 2), device="npu"),
    lambda: torch.randint(0, 5, (2, 3), device="npu"),
])
def test_random_and_uninitialised_factories(npugraph, make):
    x = make()
    assert x.device == NPU0 and x.shape == (2, 3)
    assert x.cpu().shape == (2, 3)


def test_randn_is_seeded_by_manual_seed(npugraph):
    torch.npu.manual_seed(7)
    a = torch.randn(4, device="npu").cpu()
    torch.npu.manual_seed(7)
    b = torch.randn(4, device="npu").cpu()
    assert torch.equal(a, b)


@pytest.mark.npu_devices(2)
def test_factories_on_npu_1(npugraph):
    assert torch.ones(2, device="npu:1").device == NPU1
    assert torch.tensor([3], device=NPU1).device == NPU1
    assert torch.arange(3, device="npu:1").cpu().tolist() == [0, 1, 2]


def test_cpu_returns_a_plain_cpu_tensor(npugraph):
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device="npu")
    c = x.cpu()
    assert type(c) is torch.Tensor and c.device.type == "cpu" and not c.is_npu
    assert c.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert type(x.to("cpu")) is torch.Tensor
    c[0, 0] = 100.0                   # a copy: the device tensor is unchanged
    assert x[0, 0].item() == 1.0


def test_item_tolist_nonzero(npugraph):
    x = torch.tensor([0.0, 3.0, 0.0, 5.0], device="npu")
    assert x.sum().item() == 8.0
    assert x.tolist() == [0.0, 3.0, 0.0, 5.0]
    nz = x.nonzero()
    assert nz.device == NPU0 and nz.shape == (2, 1) and nz.flatten().tolist() == [1, 3]
    assert x[x > 1].tolist() == [3.0, 5.0]
    assert bool((x > 4).any()) is True
    assert int(torch.argmax(x)) == 3


def test_numpy_needs_a_host_copy(npugraph):
    x = torch.tensor([1.0, 2.0], device="npu")
    with pytest.raises(TypeError, match="^can't convert npu:0 device type tensor to numpy. Use Tensor.cpu()"):
        x.numpy()
    assert x.numpy(force=True).tolist() == [1.0, 2.0]
    assert x.cpu().numpy().tolist() == [1.0, 2.0]


def test_cpu_scalars_and_indices_mix_with_npu_tensors(npugraph):
    x = torch.arange(4.0, device="npu")
    assert (x * torch.tensor(2.0)).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]     # a 0-dim CPU tensor is a scalar
    assert x[torch.tensor([3, 1])].cpu().tolist() == [3.0, 1.0]                  # CPU indices are fine
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([x, torch.zeros(2)])


def test_mixing_devices_raises_torchs_error(npugraph):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, device="npu") + torch.ones(2)


@pytest.mark.npu_devices(2)
def test_mixing_two_npus_raises(npugraph):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, device="npu:0") + torch.ones(2, device="npu:1")


def test_views_alias_their_base(npugraph):
    x = torch.zeros(4, 4, device="npu")
    row = x[1]
    col = x[:, 2]
    row.fill_(1.0)
    col += 5.0
    x.view(16)[15] = 9.0
    x.t()[0, 3] = 4.0                  # x[3, 0]
    assert row.device == col.device == NPU0
    expected = torch.zeros(4, 4)
    expected[1] = 1.0
    expected[:, 2] += 5.0
    expected[3, 3] = 9.0
    expected[3, 0] = 4.0
    assert torch.equal(x.cpu(), expected)
    assert row.data_ptr() == x.data_ptr() + 4 * x.element_size()
    assert x[2:].data_ptr() == x.data_ptr() + 8 * x.element_size()


def test_inplace_returns_the_same_object(npugraph):
    x = torch.ones(3, device="npu")
    assert x.add_(1) is x
    assert x.mul_(2) is x
    y = torch.empty(3, device="npu")
    assert torch.add(x, 1, out=y) is y
    assert y.cpu().tolist() == [5.0, 5.0, 5.0]


def test_out_argument_resizes(npugraph):
    out = torch.empty(0, device="npu")
    torch.mul(torch.arange(4.0, device="npu"), 2, out=out)
    assert out.shape == (4,) and out.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    r = torch.empty(2, device="npu")
    r.resize_(3, 2)
    assert r.shape == (3, 2) and r.fill_(1.0).cpu().sum().item() == 6.0


def test_printing_shows_the_npu_device(npugraph):
    x = torch.tensor([1.0, 2.0], device="npu")
    assert repr(x) == "tensor([1., 2.], device='npu:0')"
    assert "device='npu:0'" in str(torch.tensor([1, 2], device="npu"))
    assert "dtype=torch.float16" in repr(torch.ones(1, dtype=torch.float16, device="npu"))


def test_module_npu_keeps_parameters_and_trains(npugraph):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    reference = [p.detach().clone() for p in model.parameters()]
    weight = model[0].weight
    assert model.npu() is model
    assert model[0].weight is weight              # the same Parameter object, now on the NPU
    for p, ref in zip(model.parameters(), reference):
        assert isinstance(p, torch.nn.Parameter) and p.is_npu and p.requires_grad
        assert torch.equal(p.detach().cpu(), ref)
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = torch.randn(5, 3).npu()
    loss = model(x).pow(2).mean()
    assert loss.device == NPU0
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.device == NPU0 and p.grad.shape == p.shape
    # the same gradients as on the CPU
    cpu_model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        for p, ref in zip(cpu_model.parameters(), reference):
            p.copy_(ref)
    cpu_model(x.cpu()).pow(2).mean().backward()
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        assert torch.allclose(p.grad.cpu(), q.grad, atol=1e-6)


def test_optimizer_step_on_npu(npugraph):
    w = torch.nn.Parameter(torch.ones(2, device="npu"))
    opt = torch.optim.SGD([w], lr=0.5)
    (w * torch.tensor([1.0, 2.0], device="npu")).sum().backward()
    opt.step()
    assert w.device == NPU0 and w.detach().cpu().tolist() == [0.5, 0.0]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_regions(npugraph, backend):
    torch._dynamo.reset()

    def fn(a, b):
        return torch.relu(a * 2 + b).sum(dim=0)

    a = torch.arange(6.0).reshape(2, 3)
    b = torch.ones(2, 3)
    out = torch.compile(fn, backend=backend)(a.npu(), b.npu())
    assert out.device == NPU0 and out.is_npu
    assert torch.equal(out.cpu(), fn(a, b))


def test_torch_compile_module_with_new_tensors(npugraph):
    torch._dynamo.reset()
    model = torch.nn.Linear(4, 2).npu()

    @torch.compile(backend="aot_eager")
    def step(x):
        bias = torch.ones(2, device=x.device)
        return model(x) + bias

    x = torch.randn(3, 4, device="npu")
    out = step(x)
    assert out.device == NPU0
    with torch.no_grad():
        expected = torch.nn.functional.linear(x.cpu(), model.weight.cpu(), model.bias.cpu()) + 1
    assert torch.allclose(out.detach().cpu(), expected, atol=1e-6)
