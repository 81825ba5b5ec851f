"""MoE block compiled with the npugraph_ex backend, its shared expert on a native side stream.

This is how new model code (vLLM-Ascend, SGLang's NPU backend) is written: plain ``torch.npu.Stream``
and ``with torch.npu.stream(...)`` inside ``torch.compile(model, backend="npugraph_ex", options=...)``.
npugraph_ex turns the stream code into stream scopes and tagged events of the captured graph, forks
the side stream from the graph's stream at the start and joins it before the output.  It does not
order the reads inside the graph: the buggy block reads ``h`` on the side stream before waiting for
the main stream that wrote it; on hardware the shared expert computes on a partly written ``h`` in
some replays.  ``h.record_stream(side)`` (a tagged record in the graph) keeps the graph pool from
handing ``h``'s memory to the routed experts while the side stream may still read it.  The second buggy case keeps a replayed output across calls (``output-overwrite``):
fixed with ``options={"clone_output": True}``.
"""
import torch
import torch_npu

HIDDEN, INTER, EXPERTS, TOPK = 64, 128, 4, 2


def weights():
    g = torch.Generator().manual_seed(0)
    w = lambda *s: (torch.randn(*s, generator=g) / s[0] ** 0.5).npu()  # noqa: E731
    return {"gate": w(HIDDEN, EXPERTS), "up": w(EXPERTS, HIDDEN, 2 * INTER), "down": w(EXPERTS, INTER, HIDDEN),
            "shared_up": w(HIDDEN, 2 * INTER), "shared_down": w(INTER, HIDDEN), "norm": torch.ones(HIDDEN).npu()}


class MoEBlock(torch.nn.Module):
    def __init__(self, W, side, synchronized: bool):
        super().__init__()
        self.W, self.side, self.synchronized = W, side, synchronized

    def forward(self, x):
        W, main = self.W, torch.npu.current_stream()
        h, _ = torch_npu.npu_rms_norm(x, W["norm"])              # written on the graph's stream
        if self.synchronized:
            self.side.wait_stream(main)                            # fork: the side stream waits for h
        with torch.npu.stream(self.side):
            shared = torch_npu.npu_swiglu(h @ W["shared_up"]) @ W["shared_down"]
        h.record_stream(self.side)                                 # h's memory waits for the side read too
        topw, topi, _ = torch_npu.npu_moe_gating_top_k_softmax(h @ W["gate"], k=TOPK)
        expert = topi[:, :1]                                       # top-1 expert per token, dense over experts
        up = torch.stack([h @ W["up"][e] for e in range(EXPERTS)], 1)            # [tokens, experts, 2*inter]
        act = torch_npu.npu_swiglu(up.gather(1, expert[..., None].expand(-1, 1, up.shape[-1])).squeeze(1))
        down = torch.stack([act @ W["down"][e] for e in range(EXPERTS)], 1)      # [tokens, experts, hidden]
        routed = down.gather(1, expert[..., None].expand(-1, 1, HIDDEN)).squeeze(1) * topw[:, :1]
        main.wait_stream(self.side)                                # join before combining
        return routed + shared


def compiled(block, **options):
    return torch.compile(block, backend="npugraph_ex", fullgraph=True, dynamic=False,
                         **({"options": options} if options else {}))


def test_shared_expert_reading_h_before_the_fork_races(npugraph):
    step = compiled(MoEBlock(weights(), torch.npu.Stream(), synchronized=False))
    x = torch.randn(16, HIDDEN).npu()
    with npugraph.expect("race", match="npu_rms_norm"):          # h written on main, read on the side stream
        step(x)
        step(x)                                                    # every replay repeats it


def test_shared_expert_with_the_fork_is_clean_and_matches_eager(npugraph):
    W = weights()
    step = compiled(MoEBlock(W, torch.npu.Stream(), synchronized=True))
    x = torch.randn(16, HIDDEN).npu()
    for _ in range(3):
        out = step(x)
    eager = MoEBlock(W, torch.npu.current_stream(), synchronized=True)(x)   # one stream, no graph
    torch.testing.assert_close(out.cpu(), eager.cpu())
    assert npugraph.graphs[0].replays == 3
    npugraph.assert_clean()


def test_decode_loop_keeping_outputs_across_replays_reads_overwritten_data(npugraph):
    step = compiled(MoEBlock(weights(), torch.npu.Stream(), synchronized=True))
    tokens = [torch.randn(16, HIDDEN).npu() for _ in range(3)]
    kept = [step(t) for t in tokens]                               # every call returns the same buffer
    with npugraph.expect("output-overwrite"):
        torch.stack(kept).sum().item()


def test_decode_loop_with_clone_output_is_clean(npugraph):
    W = weights()
    step = compiled(MoEBlock(W, torch.npu.Stream(), synchronized=True), clone_output=True)
    tokens = [torch.randn(16, HIDDEN).npu() for _ in range(3)]
    kept = [step(t) for t in tokens]
    eager = MoEBlock(W, torch.npu.current_stream(), synchronized=True)
    for t, out in zip(tokens, kept):
        torch.testing.assert_close(out.cpu(), eager(t).cpu())
    npugraph.assert_clean()
