"""Oracle for graph values: random small programs (fills, element-wise ops, matmuls, views, in-place
updates of intermediates and of inputs) compiled with each TorchAir mode and npugraph_ex give, call
after call (capture, then replays), the values plain CPU eager gives.

Why: a replay re-runs what the capture recorded; anything the capture missed (a fill that was taken
for an allocation, an input mutation not copied back, a reinplaced op on a buffer a later call
reuses) shows up as wrong numbers on the second call, not the first."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_npu  # noqa: F401

from .helpers import backend

N = 4
UNARY = ("relu", "neg", "exp_small", "t", "slice_pad", "zeros_like_add", "ones_like_mul", "full_like_sub")
BINARY = ("add", "mul", "mm", "sub")
INPLACE = ("add_", "mul_", "fill_row_")


def _unary(kind, a):
    if kind == "relu":
        return torch.relu(a)
    if kind == "neg":
        return -a
    if kind == "exp_small":
        return torch.exp(a * 0.1)
    if kind == "t":
        return a.t()
    if kind == "slice_pad":
        return torch.cat([a[:, 1:], a[:, :1]], dim=1)
    if kind == "zeros_like_add":
        acc = torch.zeros_like(a)
        return acc + a * 2
    if kind == "ones_like_mul":
        return torch.ones_like(a) * a
    return torch.full_like(a, 0.5) - a


def _binary(kind, a, b):
    return {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "mm": torch.mm}[kind](a, b)


def _inplace(kind, a, b):
    if kind == "add_":
        a.add_(b)
    elif kind == "mul_":
        a.mul_(0.5)
    else:
        a[0].fill_(1.5)


steps = st.lists(st.one_of(
    st.tuples(st.just("u"), st.sampled_from(UNARY), st.integers(0, 7)),
    st.tuples(st.just("b"), st.sampled_from(BINARY), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("i"), st.sampled_from(INPLACE), st.integers(0, 7), st.integers(0, 7)),
), min_size=1, max_size=6)


def _program(prog, mutate_input):
    def run(x, y):
        if mutate_input:
            x.add_(1.0)                    # an input mutation: each call sees the previous one's
        values = [x, y]
        for step in prog:
            pick = lambda i: values[i % len(values)]        # noqa: E731
            if step[0] == "u":
                values.append(_unary(step[1], pick(step[2])))
            elif step[0] == "b":
                values.append(_binary(step[1], pick(step[2]), pick(step[3])))
            else:
                target = pick(step[2])
                if target is x or target is y:             # in place on intermediates only
                    target = target * 1.0
                    values.append(target)
                _inplace(step[1], target, pick(step[3]))
        return values[2:] or [x + y]
    return run


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(prog=steps, mutate_input=st.booleans(), mode=st.sampled_from(["ge", "reduce-overhead", "npugraph_ex"]))
def test_compiled_programs_give_cpu_eager_values_on_every_call(npugraph, prog, mutate_input, mode):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(len(prog))
    x, y = torch.randn(N, N, generator=gen), torch.randn(N, N, generator=gen)
    fn = _program(prog, mutate_input)
    compiled = torch.compile(fn, backend=backend(mode), dynamic=False)
    x_cpu, x_npu, y_npu = x.clone(), x.npu(), y.npu()
    for call in range(3):
        want = fn(x_cpu, y)
        got = compiled(x_npu, y_npu)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"{mode} call {call} output {i} of {prog}: {m}")
        torch.testing.assert_close(x_npu.cpu(), x_cpu, msg=lambda m: f"{mode} call {call}, input x: {m}")
