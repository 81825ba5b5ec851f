"""Replay overhead of emulated reduce-overhead graphs: a decoder block compiled with the torchair
backend (mode "reduce-overhead", two streams) replayed N times under emulation, vs the same FX graph
(the AOT graph TorchAir receives) run on plain CPU torch.  Prints both times and their ratio
(issue 14's goal: <= 1.1x; all graph analysis happens at capture, a replay only recomputes and appends).

The block: RMSNorm -> QKV -> rotary-free causal attention -> output projection -> residual, then a
SwiGLU MLP on the main stream while a shared expert runs on stream '1' (``npu_stream_switch``),
ordered by a tagged event, then combine.
"""
import argparse
import copy
import statistics
import time

import torch

import _emulation


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Decoder(torch.nn.Module):
    def __init__(self, hidden, heads, inter, tng):
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def w(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / shape[0] ** 0.5, requires_grad=False)
        self.heads, self.tng = heads, tng
        self.norm1, self.norm2 = (torch.nn.Parameter(torch.ones(hidden), requires_grad=False) for _ in range(2))
        self.qkv, self.o = w(hidden, 3 * hidden), w(hidden, hidden)
        self.up, self.down = w(hidden, 2 * inter), w(inter, hidden)
        self.s_up, self.s_down = w(hidden, 2 * inter // 4), w(inter // 4, hidden)
        self.event = tng.ops.npu_create_tagged_event(tag="bench_norm")

    def forward(self, x):
        tng = self.tng
        t, h = x.shape
        q, k, v = (rms_norm(x, self.norm1) @ self.qkv).view(t, 3, self.heads, h // self.heads).unbind(1)
        attn = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        x = x + attn.transpose(0, 1).reshape(t, h) @ self.o
        y = rms_norm(x, self.norm2)
        tng.ops.npu_tagged_event_record(self.event)
        with tng.scope.npu_stream_switch('1'):
            tng.ops.npu_tagged_event_wait(self.event)
            a, b = (y @ self.s_up).chunk(2, dim=-1)
            shared = (torch.nn.functional.silu(a) * b) @ self.s_down
        a, b = (y @ self.up).chunk(2, dim=-1)
        routed = (torch.nn.functional.silu(a) * b) @ self.down
        return x + routed + shared


def interleaved(a, b, repeats):
    """Median seconds per call of ``a`` and ``b``, alternating calls so both see the same machine load."""
    ta, tb = [], []
    for _ in range(repeats):
        for fn, samples in ((a, ta), (b, tb)):
            t = time.process_time()
            fn()
            samples.append(time.process_time() - t)
    return statistics.median(ta), statistics.median(tb), sum(tb)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--inter", type=int, default=1408)
    p.add_argument("--replays", type=int, default=200)
    a = p.parse_args()
    torch.set_num_threads(1)
    rt = _emulation.start()
    import torchair as tng

    from pytest_npugraph.compiler.aclgraph import AclConcreteGraph

    graphs, calls = [], []
    config = tng.CompilerConfig()
    config.mode = "reduce-overhead"
    config.post_grad_custom_pre_pass = lambda gm, inputs, cfg: graphs.append(copy.deepcopy(gm))
    run = AclConcreteGraph.__call__
    AclConcreteGraph.__call__ = lambda self, *args: calls.append(args) or run(self, *args)
    model = Decoder(a.hidden, a.heads, a.inter, tng).npu()
    compiled = torch.compile(model, backend=tng.get_npu_backend(compiler_config=config), dynamic=False,
                             fullgraph=True)
    x_npu = torch.randn(a.tokens, a.hidden, generator=torch.Generator().manual_seed(1)).npu()
    with torch.no_grad():
        first = compiled(x_npu)
    AclConcreteGraph.__call__ = run
    (gm,), (args,) = graphs, calls        # the AOT graph TorchAir compiles, and its arguments
    cpu_args = [t.cpu() for t in args]
    for node in gm.graph.nodes:     # its factories (masks) make tensors on the CPU
        if getattr(node.kwargs.get("device"), "type", None) == "npu":
            node.kwargs = dict(node.kwargs, device=torch.device("cpu"))
    gm.recompile()
    ref = gm(*cpu_args)[0]
    assert torch.allclose(ref, first.cpu(), atol=1e-4), "emulated replay differs from CPU torch"
    with torch.no_grad():
        n0 = len(rt.trace)
        cpu, npu, total = interleaved(lambda: gm(*cpu_args), lambda: compiled(x_npu), a.replays)
    per_call = (len(rt.trace) - n0) / a.replays
    record = rt.graphs[0]
    print(f"decoder block tokens={a.tokens} hidden={a.hidden} heads={a.heads} inter={a.inter}, "
          f"{len(record.ops)} graph nodes on streams {sorted(map(str, record.streams()))}")
    print(f"  plain CPU torch (same FX graph): {cpu * 1e3:8.2f} ms/call")
    print(f"  emulated replay                : {npu * 1e3:8.2f} ms/call  ({per_call:.0f} trace records/call, "
          f"{a.replays} replays in {total:.2f} s; captures={record.captures} replays={record.replays})")
    print(f"  ratio                          : {npu / cpu:8.2f}x  (goal <= 1.1x)")


if __name__ == "__main__":
    main()
