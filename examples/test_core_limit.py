"""Core limits on concurrent streams (eager): prefill attention, a MoE expert and a full-core-sync
op overlapped on three streams, each stream given a share of the 48 vector cores.

The rule (torchair limit_core_num docs, seed 000): streams that may run at the same time must
together use no more cores than the device has.  Shares of 20 + 20 + 20 exceed 48; a limit above
the device's count is out of range.  With 16 + 16 + 16 the overlap is safe.
"""
import pytest
import torch
import torch_npu

pytestmark = pytest.mark.npu_chip("Ascend910B1")     # 24 cube / 48 vector cores
TOKENS, HIDDEN = 32, 64


def overlapped_block(x, w_qkv, w_up, shares):
    """Attention projection, MoE expert and token selection, each on its own limited stream."""
    main = torch.npu.current_stream()
    streams = [torch.npu.Stream() for _ in shares]
    for stream, share in zip(streams, shares):
        torch.npu.set_stream_limit(stream, vector_num=share)
        stream.wait_stream(main)
    attn_s, moe_s, select_s = streams
    with torch.npu.stream(attn_s):
        qkv = torch_npu.npu_swiglu(x @ w_qkv)              # vector epilogue after the cube matmul
    with torch.npu.stream(moe_s):
        expert = torch_npu.npu_swiglu(x @ w_up)
    with torch.npu.stream(select_s):
        active = torch.nonzero(x.sum(-1) > 0)              # NonZero: every block resident at once
    for stream in streams:
        main.wait_stream(stream)
    return qkv, expert, active


def weights():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(TOKENS, HIDDEN, generator=g).npu(), torch.randn(HIDDEN, 2 * HIDDEN, generator=g).npu(),
            torch.randn(HIDDEN, 2 * HIDDEN, generator=g).npu())


def test_three_streams_limited_to_20_of_48_vector_cores_oversubscribe(npugraph):
    x, w_qkv, w_up = weights()
    with npugraph.expect("core-limit", match=r"3 ops on npu:0 may run at the same time and need \d+ vector cores"):
        overlapped_block(x, w_qkv, w_up, shares=(20, 20, 20))


def test_a_limit_above_the_device_is_out_of_range(npugraph):
    x, w_qkv, w_up = weights()
    with npugraph.expect("core-limit", match=r"vector_num=64.*must be in \[1, 48\]"):
        overlapped_block(x, w_qkv, w_up, shares=(64, 16, 16))


def test_shares_that_sum_to_the_device_are_clean(npugraph):
    x, w_qkv, w_up = weights()
    qkv, expert, active = overlapped_block(x, w_qkv, w_up, shares=(16, 16, 16))
    xc = x.cpu()
    torch.testing.assert_close(qkv.cpu(), torch_npu.npu_swiglu(x @ w_qkv).cpu())
    torch.testing.assert_close(expert.cpu(), torch_npu.npu_swiglu(xc.npu() @ w_up).cpu())
    assert active.cpu().flatten().tolist() == torch.nonzero(xc.sum(-1) > 0).flatten().tolist()
    npugraph.assert_clean()
