"""Sampler on a helper stream: a tensor handed from the main stream to another stream.

``logits`` is allocated on the main stream, read by the sampler on a helper stream, and
freed while the sampler may still be reading it.  The caching allocator hands the block to the
main stream's next allocation, whose writes can overlap the pending read — unless the tensor is
``record_stream``-ed to the helper stream.
"""
import torch
import torch_npu


def decode_step(hidden, lm_head, helper, record: bool):
    main = torch.npu.current_stream()
    logits = hidden @ lm_head                      # allocated on the main stream
    helper.wait_stream(main)
    with torch.npu.stream(helper):
        probs = torch.softmax(logits, dim=-1)      # used on the helper stream
        token = torch.argmax(probs, dim=-1)
    if record:
        logits.record_stream(helper)
    del logits                                     # freed while the helper may still read it
    nxt = torch.empty(hidden.shape[0], lm_head.shape[1], device="npu")   # may get the same block
    nxt.fill_(0.0)
    main.wait_stream(helper)
    return token, nxt


def test_free_without_record_stream_is_caught(npugraph):
    hidden, lm_head = torch.randn(8, 32).npu(), torch.randn(32, 64).npu()
    with npugraph.expect("missing-record-stream", match="record_stream"):
        decode_step(hidden, lm_head, torch.npu.Stream(), record=False)


def test_record_stream_keeps_the_block_until_the_helper_is_done(npugraph):
    hidden, lm_head = torch.randn(8, 32).npu(), torch.randn(32, 64).npu()
    token, _ = decode_step(hidden, lm_head, torch.npu.Stream(), record=True)
    torch.testing.assert_close(token.cpu(), torch.argmax(hidden.cpu() @ lm_head.cpu(), dim=-1))
    npugraph.assert_clean()
