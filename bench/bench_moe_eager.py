"""Eager overhead of the emulation: a small multi-stream MoE block on emulated npu vs the same
math on plain CPU torch, in one process, one torch thread on both sides.  Prints both times and their
ratio (issue 14's goals: <= 4x at decode shapes, 8 tokens x 256 hidden; <= 1.3x at 256 x 1024).

The block: router softmax/top-k, routed experts on the main stream, a shared expert on a side
stream (forked with wait_stream, joined with wait_stream), combine.  On the CPU the stream
calls are skipped; the math is identical.
"""
import argparse
import statistics
import time

import torch

import _emulation


def make_weights(hidden, inter, experts, device):
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(device)
    return {"router": w(hidden, experts), "up": [w(hidden, 2 * inter) for _ in range(experts)],
            "down": [w(inter, hidden) for _ in range(experts)], "shared_up": w(hidden, 2 * inter),
            "shared_down": w(inter, hidden)}


def swiglu(x):
    a, b = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


def moe_block(x, W, topk, side=None):
    npu = side is not None
    if npu:
        main = torch.npu.current_stream()
        side.wait_stream(main)
        with torch.npu.stream(side):
            shared = swiglu(x @ W["shared_up"]) @ W["shared_down"]
    else:
        shared = swiglu(x @ W["shared_up"]) @ W["shared_down"]
    probs = torch.softmax(x @ W["router"], dim=-1)
    weights, experts = torch.topk(probs, topk, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(len(W["up"])):
        mask = experts == e
        token_ids = mask.any(dim=-1).nonzero().squeeze(-1)
        if token_ids.numel() == 0:
            continue
        h = swiglu(x[token_ids] @ W["up"][e]) @ W["down"][e]
        out.index_add_(0, token_ids, h * (weights * mask)[token_ids].sum(-1, keepdim=True))
    if npu:
        main.wait_stream(side)
    return out + shared


def timed(fn, repeats):
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        samples.append(time.process_time() - t)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inter", type=int, default=1024)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(1)
    rt = _emulation.start()
    x_cpu = torch.randn(a.tokens, a.hidden, generator=torch.Generator().manual_seed(1))
    W_cpu = make_weights(a.hidden, a.inter, a.experts, "cpu")
    W_npu = make_weights(a.hidden, a.inter, a.experts, "npu")
    x_npu = x_cpu.npu()
    side = torch.npu.Stream()
    ref = moe_block(x_cpu, W_cpu, a.topk)
    got = moe_block(x_npu, W_npu, a.topk, side).cpu()
    assert torch.allclose(ref, got, atol=1e-4), "emulated result differs from CPU torch"
    cpu = timed(lambda: moe_block(x_cpu, W_cpu, a.topk), a.repeats)
    n0 = len(rt.trace)
    npu = timed(lambda: moe_block(x_npu, W_npu, a.topk, side), a.repeats)
    per_call = (len(rt.trace) - n0) / (a.repeats + 1)
    print(f"MoE block tokens={a.tokens} hidden={a.hidden} inter={a.inter} experts={a.experts} topk={a.topk}")
    print(f"  plain CPU torch : {cpu * 1e3:8.2f} ms/call")
    print(f"  emulated npu    : {npu * 1e3:8.2f} ms/call  ({per_call:.0f} trace records/call)")
    goal = "<= 4x" if a.tokens * a.hidden <= 8 * 256 else "<= 1.3x"
    print(f"  ratio           : {npu / cpu:8.2f}x  (goal {goal})")


if __name__ == "__main__":
    main()
