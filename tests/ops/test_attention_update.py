"""``npu_attention_update``: merging the partial attention of disjoint KV parts through their LSEs, as
vLLM-Ascend's context-parallel (``_npu_attention_update``) and MLA chunked-prefill paths call it.

The independent check: attention over the whole KV sequence (``scaled_dot_product_attention``) and the
log-sum-exp of all its scores must come out of merging the attention of each KV part with that part's
log-sum-exp."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu
from graph.helpers import backend

N, D = 6, 16          # rows (batch * seq * heads), head_dim


def _parts(sp=3, seed=0, lens=(5, 1, 7)):
    """Partial attention of N query rows over ``sp`` KV parts; returns (lse list, out list, full out, full lse)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(N, 1, D, generator=g)
    keys = [torch.randn(N, n, D, generator=g) for n in lens[:sp]]
    values = [torch.randn(N, n, D, generator=g) for n in lens[:sp]]
    scale = 1 / math.sqrt(D)
    lses, outs = [], []
    for k, v in zip(keys, values):
        lses.append(torch.logsumexp((q @ k.transpose(1, 2)).squeeze(1) * scale, dim=-1))
        outs.append(F.scaled_dot_product_attention(q, k, v).squeeze(1))
    k_all, v_all = torch.cat(keys, dim=1), torch.cat(values, dim=1)
    full = F.scaled_dot_product_attention(q, k_all, v_all).squeeze(1)
    full_lse = torch.logsumexp((q @ k_all.transpose(1, 2)).squeeze(1) * scale, dim=-1)
    return lses, outs, full, full_lse


@pytest.mark.parametrize("sp", [1, 2, 3])
def test_merging_the_parts_gives_attention_over_the_whole_sequence(npugraph, sp):
    lses, outs, full, full_lse = _parts(sp)
    out, lse_out = torch_npu.npu_attention_update([t.npu() for t in lses], [t.npu() for t in outs], 1)
    torch.testing.assert_close(out.cpu(), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_out.cpu(), full_lse, rtol=1e-5, atol=1e-5)
    assert lse_out.dtype == torch.float32
    kernel, = [r for r in npugraph.trace.records if type(r).__name__ == "Kernel" and "attention_update" in r.op]
    assert kernel.cores.kind == "AIV"
    npugraph.assert_clean()


def test_update_type_0_gives_no_lse_out_as_torch_npu_does(npugraph):
    lses, outs, full, _ = _parts()
    out, lse_out = torch_npu.npu_attention_update(tuple(t.npu() for t in lses), tuple(t.npu() for t in outs), 0)
    assert lse_out is None
    torch.testing.assert_close(out.cpu(), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_outputs_are_merged_in_float32(npugraph, dtype):
    lses, outs, _, _ = _parts(seed=1)
    halves = [o.to(dtype) for o in outs]
    out, _ = torch_npu.npu_attention_update([t.npu() for t in lses], [t.npu() for t in halves], 0)
    assert out.dtype == dtype
    want = torch.zeros(N, D, dtype=torch.float64)     # row by row in float64
    for r in range(N):
        values = [float(t[r]) for t in lses]
        top = max(values)
        lse_m = top + math.log(sum(math.exp(v - top) for v in values))
        for v, o in zip(values, halves):
            want[r] += math.exp(v - lse_m) * o[r].double()
    torch.testing.assert_close(out.cpu(), want.to(dtype))


def test_meta_shapes():
    lse = [torch.empty(N, device="meta")] * 2
    out = [torch.empty(N, D, dtype=torch.bfloat16, device="meta")] * 2
    o, l = torch.ops.npu.npu_attention_update(lse, out, 0)
    assert (o.shape, o.dtype, l.shape, l.dtype) == ((N, D), torch.bfloat16, (N,), torch.float32)


@pytest.mark.parametrize("change, message", [
    (dict(update_type=2), "update_type must be 0"),
    (dict(lse=[torch.zeros(N)] * 17, out=[torch.zeros(N, D)] * 17), r"sp = len\(lse\) must be in \[1, 16\]"),
    (dict(out=[torch.zeros(N, D)]), "must have the same length"),
    (dict(out=[torch.zeros(N, 12)] * 2), "head_dim must be a multiple of 8"),
    (dict(lse=[torch.zeros(N, dtype=torch.float16)] * 2), r"lse\[0\] must be float32"),
    (dict(lse=[torch.zeros(N), torch.zeros(N + 1)]), r"lse\[1\] must have shape \[6\]"),
    (dict(out=[torch.zeros(N, D), torch.zeros(N, D).half()]), r"local_out\[1\] must be torch.float32"),
])
def test_argument_errors(npugraph, change, message):
    args = dict(lse=[torch.zeros(N)] * 2, out=[torch.zeros(N, D)] * 2, update_type=0)
    args.update(change)
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_attention_update([t.npu() for t in args["lse"]], [t.npu() for t in args["out"]],
                                       args["update_type"])


def _merge(l0, l1, l2, o0, o1, o2):
    out, lse = torch_npu.npu_attention_update([l0, l1, l2], [o0, o1, o2], 1)
    merged, _ = torch_npu.npu_attention_update([l0, l1], [o0, o1], 0)
    return out.view(-1, 2, D) + 0, lse * 1, merged * 1


@pytest.mark.parametrize("mode", ["ge", "npugraph_ex", "reduce-overhead"])
def test_compiled_merges_give_the_eager_values(npugraph, mode):
    lses, outs, full, full_lse = _parts(seed=2)
    args = [t.npu() for t in lses + outs]
    eager = [t.cpu() for t in _merge(*args)]
    step = torch.compile(_merge, backend=backend(mode), dynamic=False, fullgraph=True)
    for _ in range(2):
        for got, want in zip(step(*args), eager):
            torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(eager[0].view(N, D), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eager[1], full_lse, rtol=1e-5, atol=1e-5)
