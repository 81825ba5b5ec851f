"""torch_npu's ATB paged-KV-cache ops (``torch.ops.atb``): ``_npu_reshape_and_cache`` and
``_npu_paged_attention``, as vLLM-Ascend's decode step calls them, checked against an independently
written computation (per-token Python loops and ``scaled_dot_product_attention``)."""
import contextlib

import pytest
import torch
import torch.nn.functional as F

import torch_npu
from graph.helpers import backend
from pytest_npugraph.trace import Kernel

NB, BS, KVH, D, H = 5, 4, 2, 8, 4


def _caches(device="npu"):
    return torch.zeros(NB, BS, KVH, D, device=device), torch.zeros(NB, BS, KVH, D, device=device)


def _expected_caches(key, value, slots):
    kc, vc = _caches("cpu")
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            kc[slot // BS, slot % BS] = key[i]
            vc[slot // BS, slot % BS] = value[i]
    return kc, vc


def _expected_attention(q, kc, vc, block_table, lens, scale):
    outs = []
    for b, length in enumerate(lens.tolist()):
        rows_k, rows_v = [], []
        for pos in range(length):
            block = int(block_table[b, pos // BS])
            rows_k.append(kc[block, pos % BS])
            rows_v.append(vc[block, pos % BS])
        k = torch.stack(rows_k).transpose(0, 1).repeat_interleave(H // KVH, dim=0)   # [H, L, D]
        v = torch.stack(rows_v).transpose(0, 1).repeat_interleave(H // KVH, dim=0)
        outs.append(F.scaled_dot_product_attention(q[b].unsqueeze(1), k, v, scale=scale).squeeze(1))
    return torch.stack(outs)


def _step_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    key, value = torch.randn(7, KVH, D, generator=g), torch.randn(7, KVH, D, generator=g)
    slots = torch.tensor([0, 1, 2, 3, 4, 13, -1], dtype=torch.int32)    # -1: a padding token
    q = torch.randn(2, H, D, generator=g)
    block_table = torch.tensor([[0, 1, 2], [3, 4, 0]], dtype=torch.int32)
    lens = torch.tensor([5, 2], dtype=torch.int32)                       # host tensor, as vLLM-Ascend passes
    return key, value, slots, q, block_table, lens


def test_the_ops_are_torch_npu_names_of_the_atb_namespace(npugraph):
    assert torch_npu._npu_reshape_and_cache is torch.ops.atb._npu_reshape_and_cache
    assert torch_npu._npu_paged_attention is torch.ops.atb._npu_paged_attention
    assert "_npu_paged_attention" in dir(torch_npu)


def test_reshape_and_cache_writes_each_row_at_its_slot_and_skips_padding(npugraph):
    key, value, slots, *_ = _step_inputs()
    kc, vc = _caches()
    torch_npu._npu_reshape_and_cache(key.npu(), value.npu(), kc, vc, slots.npu())
    want_k, want_v = _expected_caches(key, value, slots)
    torch.testing.assert_close(kc.cpu(), want_k)
    torch.testing.assert_close(vc.cpu(), want_v)
    kernel, = [r for r in npugraph.trace.records if type(r) is Kernel and "reshape_and_cache" in r.op]
    assert kernel.op == "atb::_npu_reshape_and_cache" and len(kernel.writes) == 2
    assert kernel.cores.kind == "ATB"


def test_paged_attention_matches_attention_over_the_gathered_sequence(npugraph):
    key, value, slots, q, block_table, lens = _step_inputs()
    kc, vc = _caches()
    torch_npu._npu_reshape_and_cache(key.npu(), value.npu(), kc, vc, slots.npu())
    out = torch.empty(2, H, D, device="npu")
    torch_npu._npu_paged_attention(query=q.npu(), key_cache=kc, value_cache=vc, num_kv_heads=KVH, num_heads=H,
                                   scale_value=0.35, block_table=block_table.npu(), context_lens=lens, out=out)
    want_k, want_v = _expected_caches(key, value, slots)
    torch.testing.assert_close(out.cpu(), _expected_attention(q, want_k, want_v, block_table, lens, 0.35),
                               rtol=1e-5, atol=1e-5)
    npugraph.assert_clean()


@pytest.mark.parametrize("bad, message", [
    (dict(slots=torch.tensor([0, 1, 2, 3, 4, 13, 99], dtype=torch.int32)), "out of range"),
    (dict(slots=torch.tensor([0, 1], dtype=torch.int32)), "one slot per token"),
    (dict(slots=torch.zeros(7)), "slot_indices must be int32"),
    (dict(value=torch.randn(7, KVH, D).half()), "dtype"),
])
def test_reshape_and_cache_rejects_bad_arguments(npugraph, bad, message):
    key, value, slots, *_ = _step_inputs()
    args = dict(key=key, value=value, slots=slots)
    args.update(bad)
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match=message):
        torch_npu._npu_reshape_and_cache(args["key"].npu(), args["value"].npu(), kc, vc, args["slots"].npu())


def test_paged_attention_rejects_heads_that_do_not_group(npugraph):
    _, _, _, q, block_table, lens = _step_inputs()
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match="multiple of num_kv_heads"):
        torch_npu._npu_paged_attention(q.npu(), kc, vc, 3, H, 1.0, block_table.npu(), lens,
                                       out=torch.empty(2, H, D, device="npu"))


@pytest.mark.parametrize("joined", [False, True], ids=["no-wait: race", "wait_stream: silent"])
def test_a_cache_write_on_a_side_stream_needs_a_wait_before_the_attention(npugraph, joined):
    key, value, slots, q, block_table, lens = _step_inputs()
    kc, vc = _caches()
    side = torch.npu.Stream()
    out = torch.empty(2, H, D, device="npu")
    args = [t.npu() for t in (key, value, slots, q, block_table)]
    side.wait_stream(torch.npu.current_stream())
    with npugraph.expect("race", match="_npu_paged_attention") if not joined else contextlib.nullcontext():
        with torch.npu.stream(side):
            torch_npu._npu_reshape_and_cache(args[0], args[1], kc, vc, args[2])
        if joined:
            torch.npu.current_stream().wait_stream(side)
        torch_npu._npu_paged_attention(args[3], kc, vc, KVH, H, 1.0, args[4], lens, out=out)
    if joined:
        assert out.isfinite().all()
        npugraph.assert_clean()


def _decode_step(key, value, kc, vc, slots, q, block_table, lens, out):
    torch_npu._npu_reshape_and_cache(key, value, kc, vc, slots)
    torch_npu._npu_paged_attention(q, kc, vc, KVH, H, 0.35, block_table, lens, out=out)
    return out * 1.0


@pytest.mark.parametrize("mode", ["ge", "npugraph_ex", "reduce-overhead"])
def test_a_compiled_decode_step_gives_the_eager_values(npugraph, mode):
    key, value, slots, q, block_table, lens = _step_inputs()
    want_k, want_v = _expected_caches(key, value, slots)
    want = _expected_attention(q, want_k, want_v, block_table, lens, 0.35)
    step = torch.compile(_decode_step, backend=backend(mode), dynamic=False)
    kc, vc = _caches()
    out = torch.empty(2, H, D, device="npu")
    args = [t.npu() for t in (key, value)] + [kc, vc, slots.npu(), q.npu(), block_table.npu(), lens, out]
    for _ in range(2):
        torch.testing.assert_close(step(*args).cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc.cpu(), want_k)


# ------------------------------------------------------------------ npu_scatter_pa_kv_cache (aclnn)
def test_scatter_pa_kv_cache_norm_writes_like_reshape_and_cache(npugraph):
    """vLLM-Ascend's ``reshape_and_cache`` adaptor: ``cache_mode="Norm"``, padding slots -1 skipped."""
    key, value, slots, *_ = _step_inputs(3)
    kc, vc = _caches()
    torch_npu.npu_scatter_pa_kv_cache(key=key.npu(), value=value.npu(), key_cache=kc, value_cache=vc,
                                      slot_mapping=slots.npu(), cache_mode="Norm")
    want_k, want_v = _expected_caches(key, value, slots)
    torch.testing.assert_close(kc.cpu(), want_k, rtol=0, atol=0)
    torch.testing.assert_close(vc.cpu(), want_v, rtol=0, atol=0)


def test_scatter_pa_kv_cache_pa_nz_lays_each_row_out_in_columns(npugraph):
    last = 4
    key, value, slots, *_ = _step_inputs(4)
    kc = torch.zeros(NB, KVH * D // last, BS, last, device="npu")
    vc = torch.zeros(NB, KVH * D // last, BS, last, device="npu")
    torch_npu.npu_scatter_pa_kv_cache(key.npu(), value.npu(), kc, vc, slots.npu())      # PA_NZ: the default
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            column_major = kc.cpu()[slot // BS, :, slot % BS, :]
            assert torch.equal(column_major.reshape(-1), key[i].reshape(-1))
            assert torch.equal(vc.cpu()[slot // BS, :, slot % BS, :].reshape(-1), value[i].reshape(-1))
    assert int((kc.cpu() != 0).any(dim=-1).sum()) == (slots >= 0).sum() * KVH * D // last


def test_scatter_pa_kv_cache_functional_leaves_the_caches_alone(npugraph):
    key, value, slots, *_ = _step_inputs(5)
    kc, vc = _caches()
    new_k, new_v = torch_npu.npu_scatter_pa_kv_cache_functional(key.npu(), value.npu(), kc, vc, slots.npu(),
                                                                cache_mode="Norm")
    want_k, want_v = _expected_caches(key, value, slots)
    torch.testing.assert_close(new_k.cpu(), want_k)
    torch.testing.assert_close(new_v.cpu(), want_v)
    assert not kc.cpu().any() and not vc.cpu().any()


def test_scatter_pa_kv_cache_refuses_what_it_does_not_emulate(npugraph):
    key, value, slots, *_ = _step_inputs()
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match="not emulated"):
        torch_npu.npu_scatter_pa_kv_cache(key.npu(), value.npu(), kc, vc, slots.npu(), cache_mode="Norm",
                                          seq_lens=torch.tensor([7]).npu())


@pytest.mark.parametrize("mode", ["npugraph_ex", "reduce-overhead"])
def test_a_compiled_scatter_pa_kv_cache_writes_the_caches(npugraph, mode):
    key, value, slots, *_ = _step_inputs(6)

    def write(k, v, kc, vc, s):
        torch_npu.npu_scatter_pa_kv_cache(k, v, kc, vc, s, cache_mode="Norm")
        return kc.sum() + vc.sum()
    step = torch.compile(write, backend=backend(mode), dynamic=False)
    kc, vc = _caches()
    step(key.npu(), value.npu(), kc, vc, slots.npu())
    want_k, want_v = _expected_caches(key, value, slots)
    torch.testing.assert_close(kc.cpu(), want_k)
    torch.testing.assert_close(vc.cpu(), want_v)
