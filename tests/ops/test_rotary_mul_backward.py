"""``npu_rotary_mul``'s backward (``npu_rotary_mul_backward``, registered as its autograd formula as
torch_npu does): gradients checked against autograd through a plain-torch forward."""
import pytest
import torch

import torch_npu


def _forward(x, r1, r2, mode):
    if mode == "half":
        a, b = x.chunk(2, dim=-1)
        rotated = torch.cat((-b, a), dim=-1)
    else:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return r1 * x + r2 * rotated


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, 4, 8, generator=g), torch.randn(1, 1, 4, 8, generator=g),
            torch.randn(1, 1, 4, 8, generator=g), torch.randn(2, 3, 4, 8, generator=g))


def _reference_grads(x, r1, r2, grad, mode):
    leaves = [t.clone().requires_grad_() for t in (x, r1, r2)]
    _forward(*leaves, mode).backward(grad)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_the_backward_op_matches_autograd_of_the_forward(npugraph, mode):
    x, r1, r2, grad = _inputs()
    got = torch_npu.npu_rotary_mul_backward(grad.npu(), x.npu(), r1.npu(), r2.npu(), mode)
    for g, w in zip(got, _reference_grads(x, r1, r2, grad, mode)):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_loss_backward_through_npu_rotary_mul(npugraph, mode):
    x, r1, r2, grad = _inputs(1)
    leaves = [t.npu().requires_grad_() for t in (x, r1, r2)]
    out = torch_npu.npu_rotary_mul(*leaves, rotary_mode=mode)
    torch.testing.assert_close(out.detach().cpu(), _forward(x, r1, r2, mode), rtol=1e-5, atol=1e-5)
    out.backward(grad.npu())
    for leaf, w in zip(leaves, _reference_grads(x, r1, r2, grad, mode)):
        torch.testing.assert_close(leaf.grad.cpu(), w, rtol=1e-5, atol=1e-5)
    assert any(getattr(r, "op", "") == "npu::npu_rotary_mul_backward" for r in npugraph.trace.records)


def test_a_bad_mode_is_refused(npugraph):
    x, r1, r2, grad = _inputs()
    with pytest.raises(RuntimeError, match="rotary_mode only supports"):
        torch_npu.npu_rotary_mul_backward(grad.npu(), x.npu(), r1.npu(), r2.npu(), "neox")
