"""``npu_gather_pa_kv_cache`` (and ``_functional``): paged KV-cache rows copied back into contiguous
key/value, as vLLM-Ascend's MLA ``kv_cache_load`` and its KV-transfer connectors call it.  Expected values
come from a flat-slot index computation (``index_select`` over the flattened cache), not the op's loop;
the PA_NZ layout is checked against the ND gather of the same values."""
from __future__ import annotations

import pytest
import torch

import torch_npu
from graph.helpers import backend

NB, BS = 6, 4          # blocks, block size
KV_LORA, ROPE = 8, 4   # MLA: the key cache holds kv_c, the value cache k_pe (one head each)


def _caches(seed=0, dtype=torch.float32, heads=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(NB, BS, heads, KV_LORA, generator=g).to(dtype),
            torch.randn(NB, BS, heads, ROPE, generator=g).to(dtype))


BLOCK_TABLE = torch.tensor([[4, 1, 5], [2, 0, 3], [1, 1, 1]], dtype=torch.int32)


def _expected(cache, block_table, lens, offsets):
    """Each sequence's flat slots block*BS + pos%BS, pos counted from the block seq_offset starts in."""
    flat = cache.reshape(NB * BS, *cache.shape[2:])
    pieces = []
    for b, (n, off) in enumerate(zip(lens, offsets)):
        pos = torch.arange(n)
        blocks = block_table[b].long()[off // BS + pos // BS]
        pieces.append(flat.index_select(0, blocks * BS + pos % BS))
    return torch.cat(pieces)


@pytest.mark.parametrize("cumsum", [False, True])
@pytest.mark.parametrize("offsets", [None, [4, 0, 8]])
def test_gather_matches_the_flat_slot_computation(npugraph, cumsum, offsets):
    kc, vc = _caches()
    lens = [5, 3, 2]
    seq_lens = torch.tensor([0, 5, 8, 10] if cumsum else lens, dtype=torch.int32)
    key, value = torch.zeros(10, 1, KV_LORA, device="npu"), torch.zeros(10, 1, ROPE, device="npu")
    kwargs = {} if offsets is None else {"seq_offset": torch.tensor(offsets, dtype=torch.int32, device="npu")}
    torch_npu.npu_gather_pa_kv_cache(kc.npu(), vc.npu(), BLOCK_TABLE.npu(), seq_lens.npu(), key=key, value=value,
                                     is_seq_lens_cumsum=cumsum, **kwargs)
    offs = offsets or [0, 0, 0]
    assert torch.equal(key.cpu(), _expected(kc, BLOCK_TABLE, lens, offs))
    assert torch.equal(value.cpu(), _expected(vc, BLOCK_TABLE, lens, offs))
    kernel, = [r for r in npugraph.trace.records if type(r).__name__ == "Kernel" and "gather_pa" in r.op]
    assert kernel.op == "npu::npu_gather_pa_kv_cache" and len(kernel.writes) == 2 and kernel.cores.kind == "AIV"
    npugraph.assert_clean()


def test_an_offset_inside_a_block_only_selects_the_first_block(npugraph):
    """The aclnn doc: seq_offset moves the start block by ``seq_offset // block_size``; tokens start at slot 0."""
    kc, vc = _caches(1)
    key, value = torch.zeros(2, 1, KV_LORA), torch.zeros(2, 1, ROPE)
    key, value = torch_npu.npu_gather_pa_kv_cache_functional(
        kc.npu(), vc.npu(), BLOCK_TABLE[:1].npu(), torch.tensor([2], dtype=torch.int32).npu(), key.npu(),
        value.npu(), seq_offset=torch.tensor([6], dtype=torch.int32).npu())
    assert torch.equal(key.cpu()[0], kc[1, 0]) and torch.equal(key.cpu()[1], kc[1, 1])
    assert torch.equal(value.cpu()[1], vc[1, 1])


def test_the_functional_form_leaves_its_inputs_and_keeps_rows_past_the_tokens(npugraph):
    kc, vc = _caches(2, torch.bfloat16)
    key, value = torch.full((7, 1, KV_LORA), 9.0, dtype=torch.bfloat16), torch.zeros(7, 1, ROPE, dtype=torch.bfloat16)
    k2, v2 = torch_npu.npu_gather_pa_kv_cache_functional(kc.npu(), vc.npu(), BLOCK_TABLE[:2].npu(),
                                                         torch.tensor([3, 2], dtype=torch.int32).npu(),
                                                         key.npu(), value.npu())
    assert torch.equal(k2.cpu()[:5], _expected(kc, BLOCK_TABLE, [3, 2], [0, 0]))
    assert (k2.cpu()[5:] == 9).all()                        # not gathered: unchanged
    assert torch.equal(v2.cpu()[:5], _expected(vc, BLOCK_TABLE, [3, 2], [0, 0]))


def test_an_output_shorter_than_the_tokens_is_filled_and_the_rest_dropped(npugraph):
    kc, vc = _caches(3)
    key, value = torch.zeros(4, 1, KV_LORA, device="npu"), torch.zeros(4, 1, ROPE, device="npu")
    torch_npu.npu_gather_pa_kv_cache(kc.npu(), vc.npu(), BLOCK_TABLE[:2].npu(),
                                     torch.tensor([3, 2], dtype=torch.int32).npu(), key, value)
    assert torch.equal(key.cpu(), _expected(kc, BLOCK_TABLE, [3, 2], [0, 0])[:4])


def test_pa_nz_caches_gather_the_same_rows_as_nd(npugraph):
    """A FRACTAL_NZ key_cache selects PA_NZ: [blocks, heads*dim // 16, block_size, 16], rows [tokens, heads*dim]."""
    heads, dim = 2, 16
    g = torch.Generator().manual_seed(4)
    nd_k, nd_v = torch.randn(NB, BS, heads, dim, generator=g), torch.randn(NB, BS, heads, dim, generator=g)

    def to_nz(nd):
        return nd.reshape(NB, BS, heads * dim // 16, 16).permute(0, 2, 1, 3).contiguous()

    kc = torch_npu.npu_format_cast(to_nz(nd_k).npu(), 29)
    vc = torch_npu.npu_format_cast(to_nz(nd_v).npu(), 29)
    assert torch_npu.get_npu_format(kc) == 29
    key, value = torch.zeros(6, heads * dim, device="npu"), torch.zeros(6, heads * dim, device="npu")
    torch_npu.npu_gather_pa_kv_cache(kc, vc, BLOCK_TABLE[:2].npu(), torch.tensor([4, 2], dtype=torch.int32).npu(),
                                     key, value, seq_offset=torch.tensor([4, 0], dtype=torch.int32).npu())
    want_k = _expected(nd_k, BLOCK_TABLE, [4, 2], [4, 0]).reshape(6, heads * dim)
    assert torch.equal(key.cpu(), want_k)
    assert torch.equal(value.cpu(), _expected(nd_v, BLOCK_TABLE, [4, 2], [4, 0]).reshape(6, heads * dim))


def test_meta_shapes():
    kc, vc = torch.empty(NB, BS, 1, KV_LORA, device="meta"), torch.empty(NB, BS, 1, ROPE, device="meta")
    key, value = torch.empty(9, 1, KV_LORA, device="meta"), torch.empty(9, 1, ROPE, device="meta")
    ints = torch.empty(3, 3, dtype=torch.int32, device="meta")
    k, v = torch.ops.npu.npu_gather_pa_kv_cache_functional(kc, vc, ints, ints[0], key, value)
    assert (k.shape, v.shape, k.device.type) == (key.shape, value.shape, "meta")
    assert torch.ops.npu.npu_gather_pa_kv_cache(kc, vc, ints, ints[0], key, value) is None


@pytest.mark.parametrize("change, message", [
    (dict(key=torch.zeros(10, 1, KV_LORA, dtype=torch.float16)), "key dtype torch.float16 must match key_cache"),
    (dict(value=torch.zeros(10, 2, ROPE)), r"value must be \[num_tokens, 1, 4\]"),
    (dict(block_tables=torch.tensor([[4, 9, 5], [2, 0, 3], [1, 1, 1]], dtype=torch.int32)),
     r"block_tables\[0\]\[1\] = 9 is out of range \[0, 6\)"),
    (dict(seq_lens=torch.tensor([5, 3, 2, 1], dtype=torch.int32)), "block_tables has 3 rows but seq_lens gives 4"),
    (dict(seq_lens=torch.tensor([13, 3, 2], dtype=torch.int32), key=torch.zeros(18, 1, KV_LORA),
          value=torch.zeros(18, 1, ROPE)), r"needs block_tables\[0\]\[3\] \(token 12"),
    (dict(seq_lens=torch.tensor([5.0, 3.0, 2.0])), "seq_lens must be int32 or int64"),
    (dict(seq_lens=torch.tensor([1, 5, 8, 10], dtype=torch.int32), is_seq_lens_cumsum=True), "starting at 0"),
])
def test_argument_errors(npugraph, change, message):
    kc, vc = _caches()
    args = dict(block_tables=BLOCK_TABLE, seq_lens=torch.tensor([5, 3, 2], dtype=torch.int32),
                key=torch.zeros(10, 1, KV_LORA), value=torch.zeros(10, 1, ROPE), is_seq_lens_cumsum=False)
    args.update(change)
    cumsum = args.pop("is_seq_lens_cumsum")
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_gather_pa_kv_cache(kc.npu(), vc.npu(), **{k: t.npu() for k, t in args.items()},
                                         is_seq_lens_cumsum=cumsum)


def _load_context(kc, vc, block_table, seq_lens, seq_starts, key, value):
    torch_npu.npu_gather_pa_kv_cache(kc, vc, block_table, seq_lens, seq_offset=seq_starts, key=key, value=value)
    return torch.cat([key, value], dim=-1) * 1.0


@pytest.mark.parametrize("mode", ["ge", "npugraph_ex", "reduce-overhead"])
def test_a_compiled_context_load_gives_the_eager_values(npugraph, mode):
    kc, vc = _caches(5)
    lens, offsets = [5, 3, 2], [4, 0, 8]
    want = torch.cat([_expected(kc, BLOCK_TABLE, lens, offsets), _expected(vc, BLOCK_TABLE, lens, offsets)], dim=-1)
    step = torch.compile(_load_context, backend=backend(mode), dynamic=False)
    key, value = torch.zeros(10, 1, KV_LORA, device="npu"), torch.zeros(10, 1, ROPE, device="npu")
    args = [kc.npu(), vc.npu(), BLOCK_TABLE.npu(), torch.tensor(lens, dtype=torch.int32).npu(),
            torch.tensor(offsets, dtype=torch.int32).npu(), key, value]
    for _ in range(2):
        torch.testing.assert_close(step(*args).cpu(), want, rtol=0, atol=0)
    assert torch.equal(key.cpu(), want[..., :KV_LORA])      # the in-place write reached the caller's tensor
