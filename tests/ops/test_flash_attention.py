"""npu_fusion_attention and its grad against independently written attention.

Expected values come from torch's own ``scaled_dot_product_attention`` (bool masks built with
``triu``/``tril``) and from autograd through a plain softmax(QK^T) V, never from the module's helpers.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from pytest_npugraph.runtime.ops import flash_attention as FA

CAUSAL_2048 = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)   # what transformers passes


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(7)


def raises(pattern: str, exc=RuntimeError):
    return pytest.raises(exc, match=re.escape(pattern))


def sdpa(q, k, v, scale, masked=None):
    """BNSD attention by torch (GQA by repeating heads); ``masked`` (bool, True = masked out)."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    keep = None if masked is None else ~masked
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)


def plain(q, k, v, scale, masked=None, pse=None, sink=None):
    """softmax(scale * (QK^T + pse)) V in float64 with autograd; sink: one extra logit per head."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2)
    if pse is not None:
        s = s + pse
    s = s * scale
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.view(1, -1, 1, 1).expand(s.size(0), -1, s.size(2), 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    if sink is not None:
        p = p[..., :-1]
    return p @ v


def close(a, b, tol=1e-4):
    torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=tol)


LAYOUT_OF_BNSD = {
    "BNSD": lambda t: t,
    "BSND": lambda t: t.transpose(1, 2),
    "BSH": lambda t: t.transpose(1, 2).flatten(2),
    "SBH": lambda t: t.permute(2, 0, 1, 3).flatten(2),
}


# ============================================================================ forward
@pytest.mark.parametrize("layout", list(LAYOUT_OF_BNSD))
def test_layouts_with_gqa_and_a_smaller_value_head_dim(layout):
    b, n, nkv, sq, skv, d, dv = 2, 4, 2, 3, 5, 8, 4
    q, k, v = torch.randn(b, n, sq, d), torch.randn(b, nkv, skv, d), torch.randn(b, nkv, skv, dv)
    to = LAYOUT_OF_BNSD[layout]
    out, smax, ssum, sout, seed, offset, numels = FA.npu_fusion_attention(to(q), to(k), to(v), n, layout, scale=0.3)
    close(out, to(sdpa(q, k, v, 0.3)))
    assert out.dtype == q.dtype
    assert smax.shape == ssum.shape == (b, n, sq, 8) and smax.dtype == torch.float32
    assert sout.shape == (0,) and (seed, offset) == (0, 0) and numels == b * n * sq * skv


def test_softmax_max_and_sum_are_the_row_statistics_repeated_eight_times():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    _, smax, ssum, *_ = FA.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.5)
    scores = 0.5 * torch.einsum("bnid,bnjd->bnij", q, k)
    expected_max = scores.max(dim=-1).values
    close(smax, expected_max.unsqueeze(-1).expand(-1, -1, -1, 8))
    close(ssum[..., 3], torch.exp(scores - expected_max.unsqueeze(-1)).sum(-1))


def masks(sq, skv):
    """Independent sparse patterns (True = masked) for query row i, key j."""
    i = torch.arange(sq).view(-1, 1)
    j = torch.arange(skv).view(1, -1)
    return {
        "left_up_causal": j > i,
        "right_down_causal": j > i + (skv - sq),
        "band_pre2_next1_right_down": (j > i + (skv - sq) + 1) | (j < i + (skv - sq) - 2),
    }


@pytest.mark.parametrize("sparse_mode, pattern", [(2, "left_up_causal"), (3, "right_down_causal"),
                                                  (4, "band_pre2_next1_right_down")])
def test_compressed_mask_sparse_modes(sparse_mode, pattern):
    sq, skv = 4, 6
    q, k, v = torch.randn(2, 2, sq, 8), torch.randn(2, 2, skv, 8), torch.randn(2, 2, skv, 8)
    out = FA.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=CAUSAL_2048, scale=0.4, sparse_mode=sparse_mode,
                                  pre_tockens=2, next_tockens=1)[0]
    close(out, sdpa(q, k, v, 0.4, masks(sq, skv)[pattern]))


def test_sparse_mode_0_takes_the_given_mask_and_the_top_left_band():
    sq = skv = 6
    q, k, v = (torch.randn(1, 2, sq, 8) for _ in range(3))
    given = torch.rand(1, 1, sq, skv) > 0.7
    given[..., 2] = False
    i, j = torch.arange(sq).view(-1, 1), torch.arange(skv).view(1, -1)
    band = (j - i > 1) | (i - j > 3)
    out = FA.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=given, pre_tockens=3, next_tockens=1)[0]
    close(out, sdpa(q, k, v, 1.0, given | band))
    full = FA.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=given.to(torch.uint8), sparse_mode=1,
                                   pre_tockens=0, next_tockens=0)[0]
    close(full, sdpa(q, k, v, 1.0, given))          # sparse_mode 1 ignores the band


def test_no_mask_ignores_sparse_mode_and_band():
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    out = FA.npu_fusion_attention(q, k, v, 2, "BNSD", sparse_mode=3, pre_tockens=0, next_tockens=0)[0]
    close(out, sdpa(q, k, v, 1.0))


def test_prefix_compressed_mode_6_sees_the_prefix_keys():
    sq, skv = 3, 5
    q, k, v = torch.randn(2, 1, sq, 4), torch.randn(2, 1, skv, 4), torch.randn(2, 1, skv, 4)
    mask = torch.zeros(3072, 2048, dtype=torch.bool)
    out = FA.npu_fusion_attention(q, k, v, 1, "BNSD", atten_mask=mask, sparse_mode=6, prefix=[1, 4])[0]
    i, j = torch.arange(sq).view(-1, 1), torch.arange(skv).view(1, -1)
    for b, prefix in enumerate([1, 4]):
        masked = (j > i + skv - sq) & (j >= prefix)
        close(out[b:b + 1], sdpa(q[b:b + 1], k[b:b + 1], v[b:b + 1], 1.0, masked))


def test_fully_masked_rows_give_zero():
    q, k, v = (torch.randn(1, 1, 3, 4) for _ in range(3))
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[1] = True
    out = FA.npu_fusion_attention(q, k, v, 1, "BNSD", atten_mask=mask, sparse_mode=1)[0]
    assert torch.equal(out[0, 0, 1], torch.zeros(4))
    close(out[0, 0, 0], sdpa(q, k, v, 1.0, mask)[0, 0, 0])


def to_tnd(seqs):
    return torch.cat([s.transpose(0, 1) for s in seqs])        # (N, S, D) pieces -> (T, N, D)


@pytest.mark.parametrize("sparse_mode", [2, 3])
def test_tnd_varlen_as_transformers_calls_it(sparse_mode):
    n, nkv, d = 4, 2, 8
    q_lens, kv_lens = [3, 1, 4], [3, 2, 4]
    qs = [torch.randn(n, s, d) for s in q_lens]
    ks = [torch.randn(nkv, s, d) for s in kv_lens]
    vs = [torch.randn(nkv, s, d) for s in kv_lens]
    cum = lambda lens: [sum(lens[:i + 1]) for i in range(len(lens))]  # noqa: E731
    out, smax, _, _, _, _, numels = FA.npu_fusion_attention(
        to_tnd(qs), to_tnd(ks), to_tnd(vs), n, pse=None, padding_mask=None, atten_mask=CAUSAL_2048,
        scale=0.35, keep_prob=1.0, input_layout="TND", actual_seq_qlen=tuple(cum(q_lens)),
        actual_seq_kvlen=tuple(cum(kv_lens)), sparse_mode=sparse_mode)[:7]
    pattern = "left_up_causal" if sparse_mode == 2 else "right_down_causal"
    expected = [sdpa(q[None], k[None], v[None], 0.35, masks(q.size(1), k.size(1))[pattern])[0]
                for q, k, v in zip(qs, ks, vs)]
    close(out, to_tnd(expected))
    assert smax.shape == (sum(q_lens), n, 8)
    assert numels == n * sum(a * b for a, b in zip(q_lens, kv_lens))


def test_tnd_trailing_zero_lengths_leave_batches_out_and_softmax_layout():
    n, d = 2, 4
    q, k, v = torch.randn(6, n, d), torch.randn(6, n, d), torch.randn(6, n, d)
    ntd = FA.npu_fusion_attention(q, k, v, n, "TND", actual_seq_qlen=[2, 5, 0], actual_seq_kvlen=[2, 5, 0])
    tnd = FA.npu_fusion_attention(q, k, v, n, "TND", actual_seq_qlen=[2, 5, 0], actual_seq_kvlen=[2, 5, 0],
                                  softmax_layout="TND")
    for lo, hi in ((0, 2), (2, 5)):
        piece = lambda t: t[lo:hi].transpose(0, 1)[None]  # noqa: E731
        close(ntd[0][lo:hi], sdpa(piece(q), piece(k), piece(v), 1.0)[0].transpose(0, 1))
    assert torch.equal(ntd[0][5], torch.zeros(n, d))                  # the token past the last end
    close(ntd[0], tnd[0])
    # same statistics, N-major memory by default, token-major with softmax_layout="TND"
    assert torch.equal(ntd[1].reshape(n, 6, 8).transpose(0, 1), tnd[1])


def test_pse_is_added_before_the_scale_and_sink_joins_the_softmax():
    b, n, s, d = 1, 2, 3, 4
    q, k, v = (torch.randn(b, n, s, d, dtype=torch.float64) for _ in range(3))
    pse = torch.randn(b, n, s, s, dtype=torch.float64)
    sink = torch.tensor([0.5, -1.0])
    out = FA.npu_fusion_attention(q, k, v, n, "BNSD", pse=pse, scale=0.5, sink=sink)[0]
    close(out, plain(q, k, v, 0.5, pse=pse, sink=sink.double()))
    row_pse = torch.randn(1, n, 1, s, dtype=torch.float64)                # 1N1S broadcasts over the rows
    close(FA.npu_fusion_attention(q, k, v, n, "BNSD", pse=row_pse)[0], plain(q, k, v, 1.0, pse=row_pse))


def test_half_inputs_keep_their_dtype():
    q, k, v = (torch.randn(1, 2, 3, 8, dtype=torch.bfloat16) for _ in range(3))
    out = FA.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.3)[0]
    assert out.dtype == torch.bfloat16
    close(out, sdpa(q.float(), k.float(), v.float(), 0.3), tol=2e-2)


# ============================================================================ grad
def autograd_reference(q, k, v, dy, scale, masked=None, pse=None, sink=None):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    extra = []
    if pse is not None:
        extra.append(pse.detach().double().requires_grad_())
    if sink is not None:
        extra.append(sink.detach().double().requires_grad_())
    pse_d = extra[0] if pse is not None else None
    sink_d = extra[-1] if sink is not None else None
    out = plain(*leaves, scale, masked, pse=pse_d, sink=sink_d)
    grads = torch.autograd.grad(out, leaves + extra, dy.double())
    return out.detach(), grads


@pytest.mark.parametrize("use_stats", [True, False])
def test_grad_matches_autograd_with_gqa_and_a_causal_mask(use_stats):
    b, n, nkv, sq, skv, d = 2, 4, 2, 4, 6, 8
    q, k, v = torch.randn(b, sq, n, d), torch.randn(b, skv, nkv, d), torch.randn(b, skv, nkv, d)
    dy = torch.randn(b, sq, n, d)
    out, smax, ssum, *_ = FA.npu_fusion_attention(q, k, v, n, "BSND", atten_mask=CAUSAL_2048, scale=0.3,
                                                  sparse_mode=3)
    stats = dict(softmax_max=smax, softmax_sum=ssum, attention_in=out) if use_stats else {}
    dq, dk, dv, dpse, dsink = FA.npu_fusion_attention_grad(q, k, v, dy, n, "BSND", atten_mask=CAUSAL_2048,
                                                           scale_value=0.3, sparse_mode=3, **stats)
    bnsd = lambda t: t.transpose(1, 2)  # noqa: E731
    _, (eq, ek, ev) = autograd_reference(bnsd(q), bnsd(k), bnsd(v), bnsd(dy), 0.3,
                                         masks(sq, skv)["right_down_causal"])
    close(dq, bnsd(eq))
    close(dk, bnsd(ek))
    close(dv, bnsd(ev))
    assert dpse is None and dsink.shape == (0,) and dsink.dtype == torch.float32


def test_grad_of_pse_and_sink():
    b, n, s, d = 2, 2, 3, 4
    q, k, v, dy = (torch.randn(b, n, s, d, dtype=torch.float64) for _ in range(4))
    pse = torch.randn(1, n, s, s, dtype=torch.float64)              # 1NSS: dpse sums over the batch
    sink = torch.tensor([0.3, -0.2])
    dq, dk, dv, dpse, dsink = FA.npu_fusion_attention_grad(q, k, v, dy, n, "BNSD", pse=pse, sink=sink,
                                                           scale_value=0.7)
    _, (eq, ek, ev, epse, esink) = autograd_reference(q, k, v, dy, 0.7, pse=pse, sink=sink)
    for got, want in ((dq, eq), (dk, ek), (dv, ev), (dpse, epse), (dsink, esink)):
        assert got.shape == want.shape
        close(got, want)


def test_grad_tnd_varlen():
    n, d = 2, 4
    lens = [2, 3]
    qs, ks, vs, dys = ([torch.randn(n, s, d) for s in lens] for _ in range(4))
    dq, dk, dv, *_ = FA.npu_fusion_attention_grad(to_tnd(qs), to_tnd(ks), to_tnd(vs), to_tnd(dys), n, "TND",
                                                  atten_mask=CAUSAL_2048, sparse_mode=3, scale_value=0.5,
                                                  actual_seq_qlen=[2, 5], actual_seq_kvlen=[2, 5])
    expected = [autograd_reference(q[None], k[None], v[None], dy[None], 0.5, masks(q.size(1), q.size(1))[
        "right_down_causal"])[1] for q, k, v, dy in zip(qs, ks, vs, dys)]
    for i, got in enumerate((dq, dk, dv)):
        close(got, to_tnd([e[i][0] for e in expected]))


def test_dropout_mask_comes_back_from_seed_and_offset():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    out, _, _, _, seed, offset, numels = FA.npu_fusion_attention(q, k, v, 2, "BNSD", keep_prob=0.5)
    assert numels == 2 * 8 * 8
    assert not torch.allclose(out, sdpa(q, k, v, 1.0))                      # something was dropped
    # out = P_drop @ V is linear in V, so <dy, out> == <dv, V> for the grad's dv with the same mask
    dy = torch.randn_like(out)
    _, _, dv, _, _ = FA.npu_fusion_attention_grad(q, k, v, dy, 2, "BNSD", keep_prob=0.5, seed=seed,
                                                  offset=offset, numels=numels)
    close((dy * out).sum(), (dv * v).sum())
    again = FA.npu_fusion_attention(q, k, v, 2, "BNSD", keep_prob=0.5)
    assert again[5] != offset                                                # a new draw every call


# ============================================================================ errors, meta
def test_argument_errors_are_op_plugins():
    q = torch.randn(1, 2, 2, 4)
    with raises("head_num must > 0, but got 0"):
        FA.npu_fusion_attention(q, q, q, 0, "BNSD")
    with raises("The input_layout should be BSH/SBH/BNSD/BSND/TND(case-insensitive), but got XYZ"):
        FA.npu_fusion_attention(q, q, q, 2, "XYZ")
    with raises("The keep_prob value must be in range of (0, 1], but got 0.0"):
        FA.npu_fusion_attention(q, q, q, 2, "BNSD", keep_prob=0.0)
    with raises("The sparse_mode value must be in range of [0,6], but got 7"):
        FA.npu_fusion_attention(q, q, q, 2, "BNSD", sparse_mode=7)
    with raises("The shapes of the input query should be 3 or 4 dimensional, but got 2-dimensional"):
        FA.npu_fusion_attention(q[0, 0], q, q, 2, "BNSD")
    with raises("softmax_layout=TND only supported when input_layout_str=TND"):
        FA.npu_fusion_attention(q, q, q, 2, "BNSD", softmax_layout="TND")
    t = torch.randn(4, 2, 4)
    with raises("The sparse_mode value must be in range of [0,5) or (5,8], but got 5"):
        FA.npu_fusion_attention(t, t, t, 2, "TND", sparse_mode=5, actual_seq_qlen=[4], actual_seq_kvlen=[4])
    with raises("the size of actual_seq_qlen and actual_seq_kvlen must be the same and cannot be empty."):
        FA.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[4])
    with raises("The shapes of the input dy should be 3 or 4 dimensional, but got 2-dimensional"):
        FA.npu_fusion_attention_grad(q, q, q, q[0, 0], 2, "BNSD")
    with pytest.raises(NotImplementedError, match="dropout_mask"):
        FA.npu_fusion_attention(q, q, q, 2, "BNSD", dropout_mask=torch.ones(8, dtype=torch.uint8))


@pytest.mark.parametrize("layout, shapes", [
    ("BSH", [(2, 3, 16), (2, 5, 8), (2, 5, 4)]),
    ("SBH", [(3, 2, 16), (5, 2, 8), (5, 2, 8)]),
    ("BSND", [(2, 3, 4, 4), (2, 5, 2, 4), (2, 5, 2, 2)]),
    ("BNSD", [(2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)]),
    ("TND", [(5, 4, 4), (6, 2, 4), (6, 2, 4)]),
])
def test_meta_shapes_match_the_computed_ones(layout, shapes):
    q, k, v = (torch.randn(s) for s in shapes)
    seq = dict(actual_seq_qlen=[2, 5], actual_seq_kvlen=[3, 6]) if layout == "TND" else {}
    real = FA.npu_fusion_attention(q, k, v, 4, layout, **seq)
    meta = FA._fa_meta(*(t.to("meta") for t in (q, k, v)), 4, layout, **seq)
    for r, m in zip(real[:4], meta[:4]):
        assert (r.shape, r.dtype) == (m.shape, m.dtype)
    assert meta[4:] == (0, 0, 0)
    dy = torch.randn(real[0].shape)
    grads = FA.npu_fusion_attention_grad(q, k, v, dy, 4, layout, **seq)
    meta_grads = FA._fa_grad_meta(*(t.to("meta") for t in (q, k, v, dy)), 4, layout, **seq)
    for r, m in zip(grads, meta_grads):
        assert (r is None and m is None) or (r.shape, r.dtype) == (m.shape, m.dtype)


# ============================================================================ on the emulated device
def test_on_npu_tensors_it_records_a_mixed_cube_vector_kernel_and_compiles(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    q, k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)
    out = torch_npu.npu_fusion_attention(q.npu(), k.npu(), v.npu(), 2, "BSND", scale=0.25,
                                         atten_mask=CAUSAL_2048.npu(), sparse_mode=3)[0]
    assert out.device.type == "npu"
    close(out.cpu(), sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.25,
                          masks(3, 3)["right_down_causal"]).transpose(1, 2))
    (kernel,) = [r for r in npugraph.trace.records if isinstance(r, Kernel) and "npu_fusion_attention" in r.op]
    assert kernel.cores.kind == "AICore"
    assert (kernel.cores.cube, kernel.cores.vector) == (npugraph.cube_cores, npugraph.vector_cores)

    def attend(q, k, v):
        return torch.ops.npu.npu_fusion_attention(q, k, v, 2, "BSND", scale=0.25)[0] * 2

    compiled = torch.compile(attend, backend="aot_eager")(q.npu(), k.npu(), v.npu())
    close(compiled.cpu(), 2 * FA.npu_fusion_attention(q, k, v, 2, "BSND", scale=0.25)[0])
    npugraph.assert_clean()
