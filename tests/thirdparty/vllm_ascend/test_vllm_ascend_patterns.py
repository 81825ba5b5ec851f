"""vLLM-Ascend's layer patterns without vLLM: the torch_npu calls its ``forward_oot`` methods make (release
0.23.0), on the emulated NPU, against plain-torch references.  Always runs; ``test_vllm_ascend_layers.py``
runs the real classes when vLLM-Ascend is importable."""
from __future__ import annotations

import pytest
import torch
import torch_npu

from pytest_npugraph.trace import Kernel

from . import reference as R


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(23)


def _ops(npugraph) -> set:
    return {r.op.split("::")[-1].split(".")[0] for r in npugraph.trace.records if type(r) is Kernel}


def cos_sin_cache(rotary_dim, max_position=64, base=10000.0):
    """vLLM RotaryEmbedding._compute_cos_sin_cache: [max_position, rotary_dim] = cat(cos, sin)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.einsum("i,j->ij", torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


# --------------------------------------------------------------------------- AscendRMSNorm.forward_oot
def rms_norm_oot(x, weight, eps, residual=None):
    if residual is not None:
        x, _, residual = torch_npu.npu_add_rms_norm(x, residual, weight, eps)
        return x, residual
    x, _ = torch_npu.npu_rms_norm(x, weight, eps)
    return x


def test_rms_norm_with_and_without_residual(npugraph):
    x, residual = torch.randn(5, 64, dtype=torch.float16), torch.randn(5, 64, dtype=torch.float16)
    weight = torch.rand(64, dtype=torch.float16) + 0.5
    out = rms_norm_oot(x.npu(), weight.npu(), 1e-6)
    torch.testing.assert_close(out.cpu().float(), R.rms_norm(x, weight, 1e-6).float(), atol=2e-3, rtol=2e-3)
    out, new_residual = rms_norm_oot(x.npu(), weight.npu(), 1e-6, residual.npu())
    want, want_residual = R.add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(out.cpu().float(), want.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(new_residual.cpu(), want_residual)
    assert {"npu_rms_norm", "npu_add_rms_norm"} <= _ops(npugraph)
    npugraph.assert_clean()


# --------------------------------------------------------------------------- rope_forward_oot (no triton)
def rope_oot(positions, query, key, cache, head_size, rotary_dim, neox):
    """vllm_ascend.ops.rotary_embedding.rope_forward_oot without triton."""
    query_shape, key_shape = query.shape, key.shape
    if rotary_dim < head_size:
        tokens = query.shape[0]
        query, key = query.view(tokens, -1, head_size), key.view(tokens, -1, head_size)
        q_rot, q_pass = query[..., :rotary_dim], query[..., rotary_dim:]
        k_rot, k_pass = key[..., :rotary_dim], key[..., rotary_dim:]
        q_rot, k_rot = q_rot.contiguous().view(tokens, -1), k_rot.contiguous().view(tokens, -1)
        torch_npu._npu_rotary_embedding(positions, q_rot, k_rot, rotary_dim, cache, neox)
        query = torch.cat((q_rot.view(tokens, -1, rotary_dim), q_pass), dim=-1).reshape(query_shape)
        key = torch.cat((k_rot.view(tokens, -1, rotary_dim), k_pass), dim=-1).reshape(key_shape)
    else:
        query = query.contiguous().view(query.shape[0], -1)
        key = key.contiguous().view(key.shape[0], -1)
        torch_npu._npu_rotary_embedding(positions, query, key, head_size, cache, neox)
    return query.view(query_shape), key.view(key_shape)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rotary_embedding(npugraph, neox, rotary_dim):
    cache, positions = cos_sin_cache(rotary_dim), torch.tensor([0, 5, 9, 2, 63, 7])
    q, k = torch.randn(6, 4 * 32), torch.randn(6, 2 * 32)
    got_q, got_k = rope_oot(positions.npu(), q.npu(), k.npu(), cache.npu(), 32, rotary_dim, neox)
    torch.testing.assert_close(got_q.cpu(), R.rope(positions, q, 32, cache, neox), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k.cpu(), R.rope(positions, k, 32, cache, neox), atol=1e-5, rtol=1e-5)
    assert "_npu_rotary_embedding" in _ops(npugraph)
    npugraph.assert_clean()


# --------------------------------------------------------------------------- AscendSiluAndMul.forward_oot
def test_silu_and_mul(npugraph):
    x = torch.randn(4, 96, dtype=torch.bfloat16)
    torch.testing.assert_close(torch_npu.npu_swiglu(x.npu()).cpu().float(), R.silu_and_mul(x).float(),
                               atol=1e-2, rtol=1e-2)
    npugraph.assert_clean()


# --------------------------------------------------------------------------- fused MoE (all-gather)
def fused_moe(x, logits, w1, w2, top_k):
    """select_experts -> TokenDispatcherWithAllGather.token_dispatch -> unquant_apply_mlp -> token_combine."""
    experts = logits.size(-1)
    weights, ids, _ = torch_npu.npu_moe_gating_top_k(logits, k=top_k, k_group=1, group_count=1, group_select_mode=1,
                                                     renorm=0, norm_type=0, routed_scaling_factor=1.0, eps=1e-20)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    sorted_x, expanded_row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
        x, ids.to(torch.int32), active_num=x.size(0) * top_k, expert_num=experts, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, experts], quant_mode=-1)
    counts = counts.to(torch.int64)
    h = torch_npu.npu_grouped_matmul(x=[sorted_x], weight=[w1.transpose(1, 2)], split_item=2, group_list_type=1,
                                     group_type=0, group_list=counts)[0]
    h = torch_npu.npu_swiglu(h)
    h = torch_npu.npu_grouped_matmul(x=[h], weight=[w2.transpose(1, 2)], split_item=2, group_list_type=1,
                                     group_type=0, group_list=counts)[0]
    return torch_npu.npu_moe_token_unpermute(permuted_tokens=h, sorted_indices=expanded_row_idx, probs=weights)


def test_fused_moe_allgather_path(npugraph):
    tokens, hidden, inter, experts, top_k = 6, 16, 8, 4, 2
    x, logits = torch.randn(tokens, hidden), torch.randn(tokens, experts)
    w1, w2 = torch.randn(experts, 2 * inter, hidden) * 0.2, torch.randn(experts, hidden, inter) * 0.2
    got = fused_moe(x.npu(), logits.npu(), w1.npu(), w2.npu(), top_k)
    torch.testing.assert_close(got.cpu(), R.moe(x, logits, w1, w2, top_k), atol=1e-4, rtol=1e-4)
    assert {"npu_moe_gating_top_k", "npu_moe_init_routing_v2", "npu_grouped_matmul", "npu_swiglu",
            "npu_moe_token_unpermute"} <= _ops(npugraph)
    npugraph.assert_clean()


def test_w8a8_gmm_swiglu_quant_fusion_matches_the_unfused_path(npugraph):
    """moe_mlp.quant_apply_mlp: the fused npu_grouped_matmul_swiglu_quant gives what its unfused branch
    (int8 npu_grouped_matmul with per-token scale, npu_swiglu, npu_dynamic_quant) gives."""
    x = torch.randn(6, 16)
    q, pertoken = torch_npu.npu_dynamic_quant(x.npu())
    w = torch.randint(-20, 20, (2, 16, 8), dtype=torch.int8)
    w_scale = torch.rand(2, 8) * 0.01 + 0.001
    counts = torch.tensor([4, 2], dtype=torch.int64)
    fused, fused_scale, _ = torch_npu.npu_grouped_matmul_swiglu_quant(q, w.npu(), counts.cumsum(0).npu(),
                                                                      w_scale.npu(), pertoken)
    h = torch_npu.npu_grouped_matmul(x=[q], weight=[w.npu()], scale=[w_scale.npu()], per_token_scale=[pertoken],
                                     split_item=2, group_list_type=1, group_type=0, group_list=counts.npu(),
                                     output_dtype=torch.float32)[0]
    unfused, unfused_scale = torch_npu.npu_dynamic_quant(torch_npu.npu_swiglu(h))
    torch.testing.assert_close(fused_scale.cpu(), unfused_scale.cpu(), atol=1e-6, rtol=1e-4)
    assert (fused.cpu().int() - unfused.cpu().int()).abs().max() <= 1     # rounding of equal values in fp32
    npugraph.assert_clean()


# --------------------------------------------------------------------------- MLA / SFA up-projection
def test_mla_up_projection_fused_and_unfused_branches_agree(npugraph):
    """sfa_v1._v_up_proj: npu_transpose_batchmatmul(x, W_UV, perm_x1=(1, 0, 2), perm_y=(1, 0, 2)) on [B, N, L], or
    transpose + torch.bmm + transpose."""
    tokens, heads, lora, v = 5, 4, 16, 8
    x, w_uv = torch.randn(tokens, heads, lora, dtype=torch.bfloat16), torch.randn(heads, lora, v, dtype=torch.bfloat16)
    fused = torch_npu.npu_transpose_batchmatmul(x.npu(), w_uv.npu(), perm_x1=(1, 0, 2), perm_y=(1, 0, 2))
    unfused = torch.bmm(x.npu().transpose(0, 1), w_uv.npu()).transpose(0, 1)
    assert fused.shape == (tokens, heads, v)
    torch.testing.assert_close(fused.cpu().float(), unfused.cpu().float(), atol=5e-2, rtol=2e-2)
    want = torch.einsum("tnl,nlv->tnv", x.double(), w_uv.double())
    torch.testing.assert_close(fused.cpu().double(), want, atol=5e-2, rtol=2e-2)
    npugraph.assert_clean()


# --------------------------------------------------------------------------- ACL graph decode step
def test_acl_graph_decode_step(npugraph):
    """Norm + rope + MoE captured into an NPUGraph after a side-stream warm-up (vLLM-Ascend's ACLGraphWrapper),
    replayed on new inputs copied into the static buffers."""
    hidden, experts, top_k = 16, 4, 2
    weight = torch.rand(hidden) + 0.5
    cache = cos_sin_cache(8, 32)
    router = torch.randn(hidden, experts) * 0.5
    w1, w2 = torch.randn(experts, 16, hidden) * 0.2, torch.randn(experts, hidden, 8) * 0.2
    dev = {name: t.npu() for name, t in dict(weight=weight, cache=cache, router=router, w1=w1, w2=w2).items()}

    def step(x, positions):
        h, residual = rms_norm_oot(x, dev["weight"], 1e-6, x)
        q, _ = rope_oot(positions, h, h[:, :8].contiguous(), dev["cache"], 8, 8, True)
        return fused_moe(q, q @ dev["router"], dev["w1"], dev["w2"], top_k) + residual

    def reference(x, positions):
        h, residual = R.add_rms_norm(x, x, weight, 1e-6)
        q = R.rope(positions, h, 8, cache, True)
        return R.moe(q, q @ router, w1, w2, top_k) + residual

    static_x, static_pos = torch.zeros(4, hidden).npu(), torch.zeros(4, dtype=torch.int64).npu()
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        step(static_x, static_pos)
    torch.npu.current_stream().wait_stream(side)
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        static_out = step(static_x, static_pos)
    for _ in range(2):
        x, positions = torch.randn(4, hidden), torch.randint(0, 32, (4,))
        static_x.copy_(x.npu())
        static_pos.copy_(positions.npu())
        graph.replay()
        torch.testing.assert_close(static_out.cpu(), reference(x, positions), atol=1e-4, rtol=1e-4)
    npugraph.assert_clean()
