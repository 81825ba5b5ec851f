"""MoE shared expert on a side stream (the vLLM-Ascend overlap pattern), eager mode.

The shared expert runs on a side stream while the routed experts run on the main stream.
The buggy variant forgets that the side stream must first wait for the main stream's
producer of ``hidden`` (and the main stream must wait before combining): a race.
"""
import pytest
import torch
import torch_npu

HIDDEN, INTER, EXPERTS, TOPK = 64, 128, 4, 2


def weights():
    g = torch.Generator().manual_seed(0)
    w = lambda *s: (torch.randn(*s, generator=g) / s[0] ** 0.5).npu()  # noqa: E731
    return {"gate": w(HIDDEN, EXPERTS), "up": w(EXPERTS, HIDDEN, 2 * INTER), "down": w(EXPERTS, INTER, HIDDEN),
            "shared_up": w(HIDDEN, 2 * INTER), "shared_down": w(INTER, HIDDEN), "norm": torch.ones(HIDDEN).npu()}


def routed_experts(h, W):
    logits = h @ W["gate"]
    topw, topi, _ = torch_npu.npu_moe_gating_top_k_softmax(logits, k=TOPK)
    out = torch.zeros_like(h)
    for e in range(EXPERTS):
        mask = (topi == e).any(-1)
        if mask.any():
            act = torch_npu.npu_swiglu(h[mask] @ W["up"][e])
            out[mask] += (act @ W["down"][e]) * topw[mask][(topi[mask] == e)].unsqueeze(-1)
    return out


def moe_layer(x, W, side, synchronized: bool):
    main = torch.npu.current_stream()
    h, _ = torch_npu.npu_rms_norm(x, W["norm"])          # produced on the main stream
    if synchronized:
        side.wait_stream(main)                             # fork: side waits for h
    with torch.npu.stream(side):
        shared = torch_npu.npu_swiglu(h @ W["shared_up"]) @ W["shared_down"]
    routed = routed_experts(h, W)
    if synchronized:
        main.wait_stream(side)                             # join: main waits for shared
    return routed + shared


def test_shared_expert_without_fork_join_races(npugraph):
    W, side = weights(), torch.npu.Stream()
    x = torch.randn(16, HIDDEN).npu()
    with npugraph.expect("race", match="npu_rms_norm"):        # h read on the side stream, unordered
        with npugraph.expect("race", match="aten::add.Tensor"):  # shared read on main, unjoined
            out = moe_layer(x, W, side, synchronized=False)
    assert out.shape == (16, HIDDEN)


@pytest.mark.npu_allow("missing-record-stream")   # the racy layer's hidden dies unjoined too
def test_shared_expert_without_fork_join_numbers(npugraph):
    """The racy variant's own numeric check: it passes in issue order (``--npu-schedule=program``, the
    default) and fails under ``--npu-schedule=shuffle`` (the side stream may read ``hidden`` before the
    main stream wrote it), as it can on hardware.  The fixed variant below passes under both."""
    W, side = weights(), torch.npu.Stream()
    x = torch.randn(16, HIDDEN).npu()
    with npugraph.expect("race", match="npu_rms_norm"), npugraph.expect("race", match="aten::add.Tensor"):
        out = moe_layer(x, W, side, synchronized=False)
    ref = moe_layer(x, W, torch.npu.current_stream(), synchronized=True)
    torch.testing.assert_close(out.cpu(), ref.cpu())


def test_shared_expert_with_fork_and_join_is_clean(npugraph):
    W, side = weights(), torch.npu.Stream()
    x = torch.randn(16, HIDDEN).npu()
    out = moe_layer(x, W, side, synchronized=True)
    ref = moe_layer(x, W, torch.npu.current_stream(), synchronized=True)   # all on one stream
    torch.testing.assert_close(out.cpu(), ref.cpu())
    npugraph.assert_clean()
