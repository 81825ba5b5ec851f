"""Sampling on a helper stream with a core limit that cannot work: the sampler is an AICPU op.

A decode step samples the next token on a helper stream while the main stream starts the next
layer.  The author limits the helper stream to 8 vector cores so it cannot starve the main stream,
but the sampler (registered in conftest.py with ``cores={"kind": "AICPU"}``) runs on the AI CPU and
ignores core limits (torchair limit_core_num docs: AICPU and ATB ops do not take limits).  The fix
keeps the limit for the ops it binds (the Ascend C softmax) and issues the AICPU sampler on a
stream without one.
"""
import torch
import torch_npu

VOCAB, HIDDEN = 128, 32


def decode_step(hidden, lm_head, w_next, helper, sampler_stream=None):
    main = torch.npu.current_stream()
    logits = hidden @ lm_head
    helper.wait_stream(main)
    with torch.npu.stream(helper):
        probs = torch.softmax(logits, dim=-1)                      # AIV: the limit applies
    sampler_stream = sampler_stream or helper
    sampler_stream.wait_stream(helper)
    with torch.npu.stream(sampler_stream):
        token = torch_npu.npu_greedy_top_k_top_p(probs, 8, 0.9)  # AICPU: no limit applies
    nxt = hidden @ w_next                                          # the next layer, on the main stream
    main.wait_stream(sampler_stream)
    return token, nxt


def inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(4, HIDDEN, generator=g).npu(), torch.randn(HIDDEN, VOCAB, generator=g).npu(),
            torch.randn(HIDDEN, HIDDEN, generator=g).npu())


def test_limit_around_an_aicpu_sampler_is_ineffective(npugraph):
    hidden, lm_head, w_next = inputs()
    helper = torch.npu.Stream()
    torch.npu.set_stream_limit(helper, vector_num=8)
    with npugraph.expect("limit-ineffective", match="npu_greedy_top_k_top_p.*AICPU ops run on the AI CPU"):
        decode_step(hidden, lm_head, w_next, helper)


def test_limit_only_on_the_stream_of_ops_it_binds_is_clean(npugraph):
    hidden, lm_head, w_next = inputs()
    helper = torch.npu.Stream()
    torch.npu.set_stream_limit(helper, vector_num=8)
    token, _ = decode_step(hidden, lm_head, w_next, helper, sampler_stream=torch.npu.Stream())
    assert token.cpu().tolist() == (hidden.cpu() @ lm_head.cpu()).argmax(-1).tolist()   # the top token
    npugraph.assert_clean()
