"""Plain-torch references of vLLM's layers (vLLM's own ``forward_native`` formulas, written out here), shared by
the real vLLM-Ascend suite and its standalone twin."""
from __future__ import annotations

import torch


def rms_norm(x, weight, eps):
    xf = x.double()
    out = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return out.to(x.dtype)


def add_rms_norm(x, residual, weight, eps):
    """vLLM's fused add + RMSNorm: (norm(x + residual), x + residual)."""
    total = (x.double() + residual.double()).to(x.dtype)
    return rms_norm(total, weight, eps), total


def rope(positions, x, head_size, cos_sin_cache, neox):
    """vLLM RotaryEmbedding.forward_native on [tokens, heads * head_size]: the first rotary_dim of each head."""
    rot = cos_sin_cache.size(-1)
    cos, sin = cos_sin_cache[positions].double().chunk(2, dim=-1)          # [T, rot/2]
    heads = x.double().reshape(x.size(0), -1, head_size)
    part, rest = heads[..., :rot], heads[..., rot:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = part.chunk(2, dim=-1)
        part = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    else:
        a, b = part[..., ::2], part[..., 1::2]
        part = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    return torch.cat((part, rest), dim=-1).reshape(x.shape).to(x.dtype)


def silu_and_mul(x):
    d = x.size(-1) // 2
    xf = x.double()
    return (torch.nn.functional.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def moe(x, router_logits, w1, w2, top_k):
    """Softmax top-k routing renormalised, each expert's SiLU-and-mul MLP (w1 [E, 2I, H], w2 [E, H, I]), the
    weighted sum: one token and one expert at a time."""
    probs = torch.softmax(router_logits.double(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.size(0)):
        for j in range(top_k):
            e = int(ids[t, j])
            h = w1[e].double() @ x[t].double()
            out[t] += weights[t, j] * (w2[e].double() @ silu_and_mul(h))
    return out.to(x.dtype)
