"""Seed 003: a decode loop replaying a reduce-overhead graph, whose outputs live in the graph's pool.

aclgraph runs at fixed addresses, so each replay writes its outputs into the same static buffers:
an output kept past the next call is silently overwritten (seed 003, scenario 2).  Fixes: clone the
outputs (``debug.aclgraph.enable_output_clone``) or consume each output before the next call.
"""
import torch
import torch_npu
import torchair
from torchair.configs.compiler_config import CompilerConfig

HIDDEN, VOCAB = 32, 64


class DecodeHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.norm = torch.nn.Parameter(torch.ones(HIDDEN))
        self.lm_head = torch.nn.Parameter(torch.randn(HIDDEN, VOCAB, generator=g) / HIDDEN ** 0.5)

    def forward(self, hidden):
        normed, _ = torch_npu.npu_rms_norm(hidden, self.norm)
        return normed @ self.lm_head


def compiled(output_clone=False):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.aclgraph.enable_output_clone = output_clone
    model = DecodeHead().npu().requires_grad_(False)          # inference: no autograd graph
    return model, torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config), dynamic=False)


def steps(n):
    g = torch.Generator().manual_seed(30)
    return [torch.randn(2, HIDDEN, generator=g).npu() for _ in range(n)]


def reference(model, hidden):
    with torch.no_grad():
        normed = hidden.cpu() * torch.rsqrt(hidden.cpu().pow(2).mean(-1, keepdim=True) + 1e-6)
        return normed @ model.lm_head.detach().cpu()


def test_logits_kept_across_replays_are_overwritten(npugraph):
    _, decode = compiled()
    with npugraph.expect("output-overwrite"):
        history = [decode(h) for h in steps(3)]      # every element aliases the same static buffer
        torch.stack(history).sum().item()


def test_the_emulated_replay_really_overwrites_the_kept_logits(npugraph):
    model, decode = compiled()
    first, second = steps(2)
    kept = decode(first)
    decode(second)
    with npugraph.expect("output-overwrite"):
        torch.testing.assert_close(kept.cpu(), reference(model, second))   # the first step's logits are gone


def test_output_clone_keeps_every_step(npugraph):
    model, decode = compiled(output_clone=True)
    inputs = steps(3)
    history = [decode(h) for h in inputs]
    for h, logits in zip(inputs, history):
        torch.testing.assert_close(logits.cpu(), reference(model, h))
    (record,) = npugraph.graphs
    assert (record.captures, record.replays) == (1, 3)
    npugraph.assert_clean()


def test_consuming_each_step_before_the_next_replay_is_clean(npugraph):
    model, decode = compiled()
    inputs = steps(3)
    tokens = [decode(h).argmax(-1).cpu() for h in inputs]              # vLLM style: sample, then replay
    assert [t.tolist() for t in tokens] == [reference(model, h).argmax(-1).tolist() for h in inputs]
    npugraph.assert_clean()
