"""``torch_npu.npu_mrope``: rotary embedding from a cos/sin cache (vLLM-Ascend's ``RotaryEmbedding`` and
Qwen2-VL's multimodal sections), checked against a per-token, per-head, per-pair loop written from
the formula (cos/sin picked per frequency from its section's position row)."""
import math

import pytest
import torch

import torch_npu

TOKENS, HEAD, ROT = 3, 8, 6


def _expected(positions, x, cache, head_size, sections, mode):
    rot, half = cache.size(-1), cache.size(-1) // 2
    out = x.clone().reshape(x.size(0), -1, head_size)
    for t in range(x.size(0)):
        for f in range(half):
            if positions.dim() == 1:
                row = int(positions[t])
            else:
                section = next(i for i in range(len(sections)) if f < sum(sections[:i + 1]))
                row = int(positions[section, t])
            c, s = float(cache[row, f]), float(cache[row, half + f])
            for h in range(out.size(1)):
                i, j = (f, f + half) if mode == "half" else (2 * f, 2 * f + 1)
                a, b = float(x.reshape(x.size(0), -1, head_size)[t, h, i]), float(
                    x.reshape(x.size(0), -1, head_size)[t, h, j])
                out[t, h, i], out[t, h, j] = a * c - b * s, b * c + a * s
    assert rot <= head_size
    return out.reshape(x.shape)


def _cache(positions_max=8):
    angles = torch.arange(positions_max)[:, None] * torch.tensor([1.0, 0.3, 0.05])[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("multimodal", [False, True], ids=["1d-positions", "mrope-sections"])
def test_query_and_key_rotate_by_their_tokens_positions(npugraph, mode, multimodal):
    g = torch.Generator().manual_seed(1)
    positions = torch.tensor([[0, 3, 5], [1, 2, 7], [4, 4, 0]]) if multimodal else torch.tensor([2, 0, 6])
    sections = [1, 1, 1] if multimodal else None
    query, key = torch.randn(TOKENS, 2 * HEAD, generator=g), torch.randn(TOKENS, HEAD, generator=g)
    cache = _cache()
    q, k = torch_npu.npu_mrope(positions.npu(), query.npu(), key.npu(), cache.npu(), HEAD,
                               mrope_section=sections, rotary_mode=mode)
    torch.testing.assert_close(q.cpu(), _expected(positions, query, cache, HEAD, sections, mode), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k.cpu(), _expected(positions, key, cache, HEAD, sections, mode), rtol=1e-5, atol=1e-5)
    assert torch.equal(q.cpu()[:, ROT:HEAD], query[:, ROT:HEAD])        # past rotary_dim: unchanged


@pytest.mark.parametrize("kwargs, message", [
    (dict(rotary_mode="neox"), "rotary_mode only support half or interleave"),
    (dict(cache_mode="x"), "cache_mode only support default or interleave"),
    (dict(mrope_section=[1, 1]), "mrope_section"),
])
def test_bad_arguments_give_the_real_messages(npugraph, kwargs, message):
    positions = torch.tensor([[0, 1, 2]] * 3).npu()
    kwargs.setdefault("mrope_section", [1, 1, 1])
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_mrope(positions, torch.randn(3, 8).npu(), torch.randn(3, 8).npu(), _cache().npu(), HEAD,
                            **kwargs)


def test_it_traces_in_a_compiled_region(npugraph):
    positions, query, key, cache = torch.tensor([2, 0, 6]), torch.randn(3, 16), torch.randn(3, 8), _cache()

    def embed(p, q, k, c):
        q, k = torch_npu.npu_mrope(p, q, k, c, HEAD)
        return q.sum() + k.sum()
    compiled = torch.compile(embed, backend="npugraph_ex", dynamic=False)
    got = compiled(positions.npu(), query.npu(), key.npu(), cache.npu())
    want = (_expected(positions, query, cache, HEAD, None, "half").sum()
            + _expected(positions, key, cache, HEAD, None, "half").sum())
    assert math.isclose(got.item(), want.item(), rel_tol=1e-4, abs_tol=1e-4)
