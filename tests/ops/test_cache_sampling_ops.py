"""npu_scatter_nd_update(_) and npu_top_k_top_p against loop-by-loop expectations."""
from __future__ import annotations

import pytest
import torch

from pytest_npugraph.runtime.ops import cache as C
from pytest_npugraph.runtime.ops import sampling as S


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(3)


# ============================================================================ scatter_nd_update
def test_scatter_nd_update_rows_and_elements():
    cache = torch.randn(6, 4)
    idx = torch.tensor([[4], [1]], dtype=torch.int32)
    rows = torch.randn(2, 4)
    out = C.npu_scatter_nd_update(cache, idx, rows)
    expected = cache.clone()
    expected[4], expected[1] = rows[0], rows[1]
    assert torch.equal(out, expected)
    assert not torch.equal(cache, expected)                              # the out-of-place form keeps its input
    grid = torch.zeros(3, 4, 5)
    pts = torch.tensor([[[0, 1], [2, 3]], [[1, 0], [2, 2]]])              # (2, 2, 2): a = 2
    upd = torch.randn(2, 2, 5)
    ret = C.npu_scatter_nd_update_(grid, pts, upd)
    assert ret is grid
    for i in range(2):
        for j in range(2):
            a, b = pts[i, j].tolist()
            assert torch.equal(grid[a, b], upd[i, j])
    assert grid.abs().sum() == pytest.approx(upd.abs().sum().item(), rel=1e-6)


def test_scatter_nd_update_argument_errors():
    cache = torch.zeros(4, 3)
    with pytest.raises(RuntimeError, match="indices must have at least 2 dims"):
        C.npu_scatter_nd_update(cache, torch.tensor([1]), torch.zeros(3))
    with pytest.raises(RuntimeError, match=r"updates must have shape \[2, 3\]"):
        C.npu_scatter_nd_update(cache, torch.tensor([[1], [2]]), torch.zeros(2, 4))
    with pytest.raises(RuntimeError, match="out of range"):
        C.npu_scatter_nd_update_(cache, torch.tensor([[4]]), torch.zeros(1, 3))
    with pytest.raises(RuntimeError, match="must be int32 or int64"):
        C.npu_scatter_nd_update_(cache, torch.tensor([[1.0]]), torch.zeros(1, 3))


def test_scatter_nd_update_inplace_on_npu_is_a_recorded_write(npugraph):
    import torch_npu
    from pytest_npugraph.trace import Kernel

    cache = torch.zeros(5, 2).npu()
    torch_npu.npu_scatter_nd_update_(cache, torch.tensor([[3]]).npu(), torch.ones(1, 2).npu())
    assert cache.cpu()[3].tolist() == [1.0, 1.0] and cache.cpu().sum() == 2
    (k,) = [r for r in npugraph.trace.records if isinstance(r, Kernel) and "npu_scatter_nd_update_" in r.op]
    assert k.writes and k.cores.kind == "AIV"
    npugraph.assert_clean()


# ============================================================================ top_k_top_p
def keep_set(row, k=None, p=None):
    """Indices kept, by descending rank: top k by value, then the smallest head whose mass reaches p."""
    ranked = sorted(range(len(row)), key=lambda i: -row[i])
    if k is not None:
        ranked = ranked[:k]
    if p is not None:
        weights = torch.softmax(torch.tensor([row[i] for i in ranked], dtype=torch.float64), 0).tolist()
        kept, mass = [], 0.0
        for i, w in zip(ranked, weights):
            if mass >= p:
                break
            kept.append(i)
            mass += w
        ranked = kept
    return set(ranked)


@pytest.mark.parametrize("use_k, use_p", [(True, True), (True, False), (False, True)])
def test_top_k_top_p_keeps_the_documented_set(use_k, use_p):
    logits = torch.randn(4, 16)
    k = torch.tensor([1, 3, 8, 16], dtype=torch.int32) if use_k else None
    p = torch.tensor([0.9, 0.5, 0.3, 0.99]) if use_p else None
    out = S.npu_top_k_top_p(logits, p, k)
    for b in range(4):
        want = keep_set(logits[b].tolist(), None if k is None else int(k[b]), None if p is None else float(p[b]))
        got = {i for i in range(16) if out[b, i] != float("-inf")}
        assert got == want
        for i in got:
            assert out[b, i] == logits[b, i]


def test_top_k_top_p_always_keeps_the_largest_and_checks_arguments():
    logits = torch.randn(2, 8, dtype=torch.bfloat16)
    out = S.npu_top_k_top_p(logits, torch.zeros(2, dtype=torch.bfloat16), None)
    assert out.dtype == torch.bfloat16
    assert [(row != float("-inf")).sum().item() for row in out] == [1, 1]
    assert torch.equal(out.argmax(-1), logits.argmax(-1))
    with pytest.raises(RuntimeError, match="p and k cannot both be None"):
        S.npu_top_k_top_p(logits)
    with pytest.raises(RuntimeError, match="k must be int32"):
        S.npu_top_k_top_p(logits, None, torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="logits must be 2-dimensional"):
        S.npu_top_k_top_p(logits[0], None, torch.tensor([1], dtype=torch.int32))


# ============================================================================ formats
def test_format_casts_tag_the_storage_and_get_npu_format_reads_it(npugraph):
    import torch_npu

    x = torch.rand(2, 3, 4, 5).npu()
    assert torch_npu.get_npu_format(x) == torch_npu.Format.NCHW == 0        # the doc's example
    nz = torch_npu.npu_format_cast(x, 29)
    assert torch_npu.get_npu_format(nz) == torch_npu.Format.FRACTAL_NZ
    assert torch_npu.get_npu_format(x) == 0 and torch.equal(nz.cpu(), x.cpu())   # a copy; values kept
    assert torch_npu.get_npu_format(nz[0]) == 29                                 # views share the storage's format
    w = torch.rand(4, 8).npu()
    assert torch_npu.get_npu_format(w) == torch_npu.Format.ND
    torch_npu.npu_format_cast_(w, nz)
    assert torch_npu.get_npu_format(w) == 29
    assert torch_npu.get_npu_format(torch_npu.npu_format_cast(torch.rand(3).npu(), w)) == 29
