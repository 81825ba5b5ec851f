"""A training step as user code writes it: foreach optimisers, grad clipping, autocast, grad scaling."""
import copy

import pytest
import torch
import torch_npu


def _train(model, opt, steps=3, clip_foreach=None):
    torch.manual_seed(1)
    device = next(model.parameters()).device
    for _ in range(steps):
        x = torch.randn(5, 4).to(device)
        loss = model(x).square().mean()
        loss.backward()
        if clip_foreach is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, foreach=clip_foreach)
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.parametrize("make", [
    lambda p, fe: torch.optim.AdamW(p, lr=1e-2, foreach=fe),
    lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=fe),
    lambda p, fe: torch.optim.Adam(p, lr=1e-2, foreach=fe),
], ids=["AdamW", "SGD", "Adam"])
def test_foreach_optimiser_step_matches_the_cpu(npugraph, make):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    npu = copy.deepcopy(cpu).npu()
    _train(npu, make(npu.parameters(), True), clip_foreach=True)
    _train(cpu, make(cpu.parameters(), False), clip_foreach=False)
    for a, b in zip(npu.parameters(), cpu.parameters()):
        assert a.device.type == "npu"
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)


def test_inplace_foreach_ops(npugraph):
    xs = [torch.ones(3, device="npu"), torch.full((2,), 2.0, device="npu")]
    torch._foreach_add_(xs, 1)
    torch._foreach_mul_(xs, [torch.tensor(2.0, device="npu"), torch.tensor(3.0, device="npu")])
    torch._foreach_addcmul_(xs, xs, xs, value=0.5)
    assert xs[0].cpu().tolist() == [12.0] * 3 and xs[1].cpu().tolist() == [49.5] * 2
    assert [t.cpu().item() for t in torch._foreach_norm(xs)] == pytest.approx([12.0 * 3 ** 0.5, 49.5 * 2 ** 0.5])


def test_inplace_foreach_on_a_side_stream_is_a_race(npugraph):
    xs = [torch.ones(3, device="npu") for _ in range(2)]
    side = torch.npu.Stream()
    with npugraph.expect("race"):
        with torch.npu.stream(side):
            torch._foreach_add_(xs, 1)          # no wait for the default stream's fill: a race


def test_autocast_region_runs_matmuls_in_half_and_sensitive_ops_in_float(npugraph):
    x = torch.randn(4, 4, device="npu")
    lin = torch.nn.Linear(4, 4).npu()
    with torch.autocast("npu"):
        y = lin(x)
        z = x @ x
        s = torch.softmax(z, -1)
        lg = torch.log(z.abs() + 1)
        added = x + x
    assert y.dtype == z.dtype == torch.float16
    assert lg.dtype == torch.float32 and added.dtype == torch.float32 and s.dtype == torch.float32
    torch.testing.assert_close(z.float().cpu(), (x.cpu().half().float() @ x.cpu().half().float()), rtol=2e-3, atol=2e-3)
    assert (x @ x).dtype == torch.float32          # outside the region: float again


def test_npu_amp_autocast_and_grad_scaler_train(npugraph):
    model = torch.nn.Linear(4, 1).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.npu.amp.GradScaler(init_scale=1024.0)
    before = model.weight.detach().cpu().clone()
    with torch.npu.amp.autocast(dtype=torch.bfloat16):
        out = model(torch.randn(8, 4, device="npu"))
        assert out.dtype == torch.bfloat16 and torch.npu.is_autocast_enabled()
        loss = out.float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(model.weight.detach().cpu(), before)
    assert scaler.get_scale() == 1024.0 and not torch.npu.is_autocast_enabled()


def test_legacy_tensor_types(npugraph):
    t = torch.npu.FloatTensor(2, 3)
    assert t.shape == (2, 3) and t.dtype == torch.float32 and t.device.type == "npu"
    assert isinstance(t, torch.npu.FloatTensor) and not isinstance(t, torch.npu.HalfTensor)
    assert not isinstance(torch.zeros(2), torch.npu.FloatTensor)
    assert torch.npu.LongTensor([1, 2]).cpu().tolist() == [1, 2]
    assert t.type() == "torch.npu.FloatTensor"


def test_get_npu_format(npugraph):
    assert torch_npu.get_npu_format(torch.ones(1, 2, 3, 4, device="npu")) == torch_npu.Format.NCHW
    assert torch_npu.get_npu_format(torch.ones(2, 3, device="npu")) == 2
    assert str(torch_npu.get_npu_format(torch.ones(1, 1, 1, 1, 1, device="npu"))) == "NCDHW"
    with pytest.raises(TypeError):
        torch_npu.get_npu_format([1, 2])


def test_tensor_type_converts_to_a_legacy_npu_type(npugraph):
    """``x.type(torch.npu.HalfTensor)`` (old AMP and checkpoint code): torch reads the type's name."""
    x = torch.tensor([1.5, 2.5]).npu()
    half = x.type(torch.npu.HalfTensor)
    assert half.dtype == torch.float16 and half.device.type == "npu"
    assert half.type() == "torch.npu.HalfTensor"
    moved = torch.tensor([3, 4]).type(torch.npu.LongTensor)
    assert moved.device.type == "npu" and moved.cpu().tolist() == [3, 4]
    assert x.type(dtype=torch.npu.IntTensor).dtype == torch.int32
    assert x.type("torch.npu.DoubleTensor").dtype == torch.float64
    assert x.type(torch.HalfTensor).device.type == "cpu"
    with pytest.raises(TypeError, match="dtype must be a type, str, or dtype object"):
        x.type(5)
