"""Prompt/incremental flash attention, fused infer attention v2 and the FIA ``.out`` path against torch's
scaled_dot_product_attention and a plain softmax written here."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pytest_npugraph.runtime.ops import attention as A

CAUSAL_2048 = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(17)


def close(a, b, tol=1e-4):
    torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=tol)


def sdpa(q, k, v, scale, masked=None):
    """BNSD attention by torch, GQA by repeating KV heads; ``masked``: True = masked out."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if masked is None else ~masked, scale=scale)


def causal(sq, skv, right_down=True):
    i, j = torch.arange(sq).view(-1, 1), torch.arange(skv).view(1, -1)
    return j > i + (skv - sq if right_down else 0)


# ============================================================================ prompt flash attention
def test_pfa_default_next_tokens_zero_makes_a_given_mask_causal():
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    out = A.npu_prompt_flash_attention(q, k, v, atten_mask=torch.zeros(4, 4, dtype=torch.bool), num_heads=2,
                                       scale_value=0.3, input_layout="BNSD")
    close(out, sdpa(q, k, v, 0.3, causal(4, 4)))
    no_mask = A.npu_prompt_flash_attention(q, k, v, num_heads=2, scale_value=0.3, input_layout="BNSD")
    close(no_mask, sdpa(q, k, v, 0.3))


@pytest.mark.parametrize("sparse_mode", [3, 13])
def test_pfa_bsh_gqa_right_down_causal_and_high_precision_modes(sparse_mode):
    b, sq, skv, n, nkv, d = 2, 3, 5, 4, 2, 4
    q, k, v = torch.randn(b, n, sq, d), torch.randn(b, nkv, skv, d), torch.randn(b, nkv, skv, d)
    bsh = lambda t: t.transpose(1, 2).flatten(2)  # noqa: E731
    out = A.npu_prompt_flash_attention(bsh(q), bsh(k), bsh(v), atten_mask=CAUSAL_2048, num_heads=n,
                                       num_key_value_heads=nkv, scale_value=0.5, input_layout="BSH",
                                       sparse_mode=sparse_mode)
    close(out, bsh(sdpa(q, k, v, 0.5, causal(sq, skv))))


def test_pfa_tnd_varlen():
    n, d = 2, 4
    lens = [2, 3]
    qs, ks, vs = ([torch.randn(n, s, d) for s in lens] for _ in range(3))
    tnd = lambda pieces: torch.cat([p.transpose(0, 1) for p in pieces])  # noqa: E731
    out = A.npu_prompt_flash_attention(tnd(qs), tnd(ks), tnd(vs), atten_mask=CAUSAL_2048, num_heads=n,
                                       input_layout="TND", actual_seq_lengths=[2, 5], actual_seq_lengths_kv=[2, 5],
                                       sparse_mode=3)
    close(out, tnd([sdpa(q[None], k[None], v[None], 1.0, causal(q.size(1), q.size(1)))[0]
                    for q, k, v in zip(qs, ks, vs)]))
    assert A._pfa_meta(tnd(qs), tnd(ks), tnd(vs), input_layout="TND").shape == out.shape


# ============================================================================ incremental flash attention
def test_ifa_decode_with_kv_lengths_and_a_paged_cache():
    b, n, nkv, d, skv, block = 2, 4, 2, 8, 6, 4
    q = torch.randn(b, 1, n * d)
    k, v = torch.randn(b, nkv, skv, d), torch.randn(b, nkv, skv, d)
    lengths = [6, 3]
    bsh = lambda t: t.transpose(1, 2).flatten(2)  # noqa: E731
    out = A.npu_incre_flash_attention(q, bsh(k), bsh(v), actual_seq_lengths=lengths, num_heads=n,
                                      num_key_value_heads=nkv, scale_value=0.25, input_layout="BSH")
    q4 = q.view(b, 1, n, d).transpose(1, 2)
    for i, length in enumerate(lengths):
        want = sdpa(q4[i:i + 1], k[i:i + 1, :, :length], v[i:i + 1, :, :length], 0.25)
        close(out[i], want.transpose(1, 2).flatten(2)[0])
    # the same KV in a paged cache: (blocks, block, nkv*d), batch i uses blocks table[i]
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    pool_k, pool_v = torch.zeros(4, block, nkv * d), torch.zeros(4, block, nkv * d)
    for i in range(b):
        for j, blk in enumerate(table[i].tolist()):
            chunk = slice(j * block, min((j + 1) * block, skv))
            pool_k[blk, :chunk.stop - chunk.start] = bsh(k)[i, chunk]
            pool_v[blk, :chunk.stop - chunk.start] = bsh(v)[i, chunk]
    paged = A.npu_incre_flash_attention(q, pool_k, pool_v, actual_seq_lengths=lengths, block_table=table,
                                        block_size=block, num_heads=n, num_key_value_heads=nkv, scale_value=0.25,
                                        input_layout="BSH")
    close(paged, out)
    assert A._ifa_meta(q, pool_k, pool_v).shape == paged.shape


# ============================================================================ FIA v2 and .out
def test_fia_v2_renames_v1_and_learnable_sink_takes_probability_mass():
    n, d = 2, 4
    q, k, v = torch.randn(5, n, d), torch.randn(5, n, d), torch.randn(5, n, d)
    sink = torch.tensor([0.7, -0.4])
    out, lse = A.npu_fused_infer_attention_score_v2(q, k, v, num_query_heads=n, softmax_scale=0.5,
                                                    input_layout="TND", actual_seq_qlen=[2, 5],
                                                    actual_seq_kvlen=[2, 5], learnable_sink=sink,
                                                    return_softmax_lse=True)
    for lo, hi in ((0, 2), (2, 5)):
        qs, ks, vs = (t[lo:hi].transpose(0, 1).double() for t in (q, k, v))   # (N, S, D)
        scores = 0.5 * qs @ ks.transpose(-1, -2)
        full = torch.cat([scores, sink.double().view(n, 1, 1).expand(n, hi - lo, 1)], dim=-1)
        probs = torch.softmax(full, dim=-1)[..., :-1]
        close(out[lo:hi], (probs @ vs).transpose(0, 1))
        close(lse[lo:hi, :, 0], torch.logsumexp(full, dim=-1).transpose(0, 1))
    plain, empty = A.npu_fused_infer_attention_score_v2(q[None], k[None], v[None], num_query_heads=n,
                                                        input_layout="BSND")
    v1, _ = A.npu_fused_infer_attention_score(q[None], k[None], v[None], num_heads=n, input_layout="BSND")
    assert torch.equal(plain, v1) and empty.shape == (0,)
    with pytest.raises(NotImplementedError, match="dequant_scale_key"):
        A.npu_fused_infer_attention_score_v2(q, k, v, dequant_scale_key=torch.ones(1), input_layout="TND",
                                             actual_seq_qlen=[5], actual_seq_kvlen=[5], num_query_heads=n)


@pytest.mark.parametrize("layout, shapes, heads", [
    ("BSH", [(2, 3, 16), (2, 5, 8), (2, 5, 8)], 4),
    ("BNSD_BSND", [(2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)], 4),
    ("BSND_NBSD", [(2, 3, 4, 4), (2, 5, 2, 4), (2, 5, 2, 4)], 4),
    ("TND_NTD", [(5, 4, 4), (6, 2, 4), (6, 2, 4)], 4),
])
def test_output_shapes_of_meta_infer_output_and_compute_agree(layout, shapes, heads):
    q, k, v = (torch.randn(s) for s in shapes)
    seq = dict(actual_seq_lengths=[2, 5], actual_seq_lengths_kv=[3, 6]) if "TND" in layout else {}
    out, lse = A.npu_fused_infer_attention_score(q, k, v, num_heads=heads, num_key_value_heads=2,
                                                 input_layout=layout, softmax_lse_flag=True, **seq)
    meta = A._fia_meta(q.to("meta"), k.to("meta"), v.to("meta"), num_heads=heads, num_key_value_heads=2,
                       input_layout=layout, softmax_lse_flag=True)
    buffers = A._npu_fused_infer_attention_score_infer_output(q, v, input_layout=layout, num_heads=heads,
                                                              num_key_value_heads=2, softmax_lse_flag=True)
    for got in (meta, buffers):
        assert [(t.shape, t.dtype) for t in got] == [(out.shape, out.dtype), (lse.shape, lse.dtype)]


def test_out_overload_writes_caller_buffers_and_skips_the_dummy_lse():
    q, k, v = (torch.randn(1, 2, 1, 8) for _ in range(3))
    kwargs = dict(num_heads=2, input_layout="BNSD", scale=0.3, actual_seq_lengths_kv=[1])
    workspace = A._workspace(q, k, v, **kwargs)
    out_buf, lse_buf = torch.zeros(1, 2, 1, 8), torch.full((1,), 7.0)
    ret = A.npu_fused_infer_attention_score_out(q, k, v, workspace=workspace, attention_out=out_buf,
                                                softmax_lse=lse_buf, **kwargs)
    assert ret[0] is out_buf and ret[1] is lse_buf
    close(out_buf, A.npu_fused_infer_attention_score(q, k, v, **kwargs)[0])
    assert lse_buf.item() == 7.0                                   # softmax_lse_flag=False: not written
    assert workspace.dtype == torch.uint8
    with pytest.raises(RuntimeError, match="attention_out has shape"):
        A.npu_fused_infer_attention_score_out(q, k, v, attention_out=torch.zeros(3), softmax_lse=lse_buf, **kwargs)


def test_out_overload_on_npu_records_the_write_and_is_graph_updatable(npugraph):
    import torch_npu
    from pytest_npugraph.runtime.ops import registry
    from pytest_npugraph.trace import Kernel

    q, k, v = (torch.randn(1, 2, 1, 8).npu() for _ in range(3))
    out_buf, lse_buf = torch.zeros(1, 2, 1, 8).npu(), torch.zeros(1).npu()
    torch.ops.npu.npu_fused_infer_attention_score.out(q, k, v, num_heads=2, input_layout="BNSD",
                                                      attention_out=out_buf, softmax_lse=lse_buf)
    close(out_buf.cpu(), torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=2,
                                                                   input_layout="BNSD")[0].cpu())
    kernel = [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.op.endswith(".out")][0]
    assert kernel.writes and kernel.cores.kind == "AICore"
    specs = registry.by_name()
    for name in ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score.out",
                 "npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score_v2.out"):
        assert specs[name].graph_updatable
    npugraph.assert_clean()
