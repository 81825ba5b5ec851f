"""reinplace-conflict: what TorchAir's reinplace passes do to a multi-stream decode step.

1. An applied reinplace that races (error).  The rope half of ``kv`` is read on stream '1' through a
   view taken on the main stream (``k_rope = kv[:, :R]``), then ``kv.mul(scale)`` on main.  The
   tensor node ``kv`` has two direct users, the slice and the mul, both on main, so
   ``ReinplaceStreamChecker`` lets the pass turn ``mul`` into ``mul_``: the compiled graph now
   overwrites ``kv`` while stream '1' may still be reading it.  Fixed: stream '1' records a tagged
   event after its read and main waits for it before the update.

2. A vetoed reinplace (warning).
The KV projection ``kv`` is read by the attention-score matmul on stream '1' (ordered by tagged
events) and then updated out of place on the main stream (``kv.add(bias)``).  The config leaves
TorchAir's reinplace-inplaceable-ops pass on, expecting ``add`` to become ``add_``; but the tensor
has users on two stream labels, so ``ReinplaceStreamChecker`` keeps the functional op: a warning
that the graph pays a copy.  Fixed: the update runs on stream '1' next to the other user (one
label), and the pass in-places it.
"""
import torch
import torch_npu
import torchair as tng
from torchair.configs.compiler_config import CompilerConfig

N = 8
R = 4


class RopeScale(torch.nn.Module):
    def __init__(self, wait_for_the_read=False):
        super().__init__()
        self.wait_for_the_read = wait_for_the_read
        self.kv_ready = tng.ops.npu_create_tagged_event(tag="rope_kv_ready")
        self.rope_done = tng.ops.npu_create_tagged_event(tag="rope_done")

    def forward(self, h, wkv, q, scale):
        kv = h @ wkv
        k_rope = kv[:, :R]                                     # a view of kv, taken on main
        tng.ops.npu_tagged_event_record(self.kv_ready)
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.kv_ready)
            rope_scores = q[:, :R] @ k_rope.T                  # reads kv on stream '1'
            tng.ops.npu_tagged_event_record(self.rope_done)
        if self.wait_for_the_read:
            tng.ops.npu_tagged_event_wait(self.rope_done)
        kv_scaled = kv.mul(scale)                              # reinplaced into kv.mul_(scale)
        return rope_scores, kv_scaled


class Decode(torch.nn.Module):
    def __init__(self, update_on_side_stream=False):
        super().__init__()
        self.update_on_side_stream = update_on_side_stream
        self.kv_ready = tng.ops.npu_create_tagged_event(tag="kv_ready")
        self.scores_done = tng.ops.npu_create_tagged_event(tag="scores_done")

    def forward(self, h, wkv, q, bias):
        kv = h @ wkv
        tng.ops.npu_tagged_event_record(self.kv_ready)
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.kv_ready)
            scores = q @ kv.T                                  # reads kv on stream '1'
            if self.update_on_side_stream:
                kv_next = kv.add(bias)                         # same stream: reinplaced
            tng.ops.npu_tagged_event_record(self.scores_done)
        tng.ops.npu_tagged_event_wait(self.scores_done)
        if not self.update_on_side_stream:
            kv_next = kv.add(bias)                             # main stream: vetoed, a copy
        return scores, kv_next


def compiled(model):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    return torch.compile(model, backend=tng.get_npu_backend(compiler_config=config), dynamic=False, fullgraph=True)


def inputs():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(N, N, generator=g).npu() for _ in range(4)]


def check(scores, kv_next, h, wkv, q, bias):
    h, wkv, q, bias = (t.cpu() for t in (h, wkv, q, bias))
    torch.testing.assert_close(scores.cpu(), q @ (h @ wkv).T)
    torch.testing.assert_close(kv_next.cpu(), h @ wkv + bias)


def test_reinplaced_update_overwrites_a_view_another_stream_reads(npugraph):
    model = compiled(RopeScale())
    h, wkv, q, scale = inputs()
    with npugraph.expect("reinplace-conflict", match=r"turned aten::mul\.Tensor .* into aten::mul_\.Tensor"):
        for _ in range(2):
            rope_scores, kv_scaled = model(h, wkv, q, scale)
    kv = h.cpu() @ wkv.cpu()
    torch.testing.assert_close(rope_scores.cpu(), q.cpu()[:, :R] @ kv[:, :R].T)
    torch.testing.assert_close(kv_scaled.cpu(), kv * scale.cpu())


def test_reinplaced_update_after_waiting_for_the_read_is_clean(npugraph):
    model = compiled(RopeScale(wait_for_the_read=True))
    h, wkv, q, scale = inputs()
    for _ in range(2):
        rope_scores, kv_scaled = model(h, wkv, q, scale)
    kv = h.cpu() @ wkv.cpu()
    torch.testing.assert_close(kv_scaled.cpu(), kv * scale.cpu())
    npugraph.assert_clean()


def test_update_on_another_stream_than_the_read_vetoes_the_reinplace(npugraph):
    model = compiled(Decode())
    args = inputs()
    with npugraph.expect("reinplace-conflict", match=r"multi-stream disables it for node add.*pay a copy"):
        out = model(*args)
    check(*out, *args)


def test_update_on_the_reading_stream_is_reinplaced(npugraph):
    model = compiled(Decode(update_on_side_stream=True))
    args = inputs()
    for _ in range(2):
        out = model(*args)
    check(*out, *args)
    npugraph.assert_clean()
