"""The shortcuts of the per-op path (issue 14) record what the general path records.

Each shortcut skips work on the common case: a view of one tensor skips the general dispatch,
a contiguous tensor's span skips the layout walk, a call site's ``Site`` is made once.  These
tests pin that the trace, the reports and the results stay the same.
"""
import pytest
import torch
import torch_npu  # noqa: F401
from hypothesis import given, settings, strategies as st

from pytest_npugraph import trace as T
from pytest_npugraph.runtime import tensor as npu_tensor


def kernels(npugraph, start=0):
    return [r for r in npugraph.trace.records[start:] if isinstance(r, T.Kernel)]


# ------------------------------------------------------------------- views
VIEWS = {
    "view": lambda x: x.view(6, 4),
    "t": lambda x: x.t(),
    "slice": lambda x: x[1:3],
    "expand": lambda x: x.expand(2, 4, 6),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "as_strided": lambda x: x.as_strided((2, 2), (1, 2)),
    "dtype view": lambda x: x.view(torch.int32),
    "split": lambda x: x.split(2),
    "unbind": lambda x: x.unbind(0),
}


@pytest.mark.parametrize("make", VIEWS.values(), ids=VIEWS.keys())
def test_a_view_shares_the_block_and_records_nothing(npugraph, make):
    x = torch.randn(4, 6).npu()
    start = len(npugraph.trace)
    out = make(x)
    assert len(npugraph.trace) == start
    many = isinstance(out, (list, tuple))
    for t, want in zip(out if many else (out,), make(x.cpu()) if many else (make(x.cpu()),)):
        assert type(t) is npu_tensor.NpuTensor and t.device == x.device
        assert t._block is x._block
        assert torch.equal(t.cpu(), want)


def test_a_view_takes_the_plan_shortcut(npugraph):
    """The shortcut is taken (not the general path) for a view of one tensor, and not for an op that
    merely returns an alias among other tensors."""
    x = torch.randn(4, 6).npu()
    x.view(24), x.t()
    plans = {p.name: p for p in npugraph_plans()}
    assert plans["aten::view"].view_of_first and plans["aten::t"].view_of_first
    x + x
    assert not {p.name: p for p in npugraph_plans()}["aten::add.Tensor"].view_of_first


def npugraph_plans():
    return list(npu_tensor._plans.values())


def test_views_of_a_graph_outputs_handle_stay_handles(npugraph):
    g = torch.npu.NPUGraph()
    x = torch.randn(4, 4).npu()
    with torch.npu.graph(g):
        y = x * 2
    g.replay()
    y._graph_call = object()          # as a replay hands out its output (see note_output_reads)
    assert y.view(16)._graph_call is y._graph_call
    assert all(t._graph_call is y._graph_call for t in y.split(2))


def test_unsafe_view_is_a_view_not_a_task(npugraph):
    """``matmul`` of a 3-D tensor returns ``_unsafe_view(mm(...))``: one kernel, the mm."""
    x, w = torch.randn(2, 3, 4).npu(), torch.randn(4, 5).npu()
    start = len(npugraph.trace)
    y = x @ w
    assert [k.op for k in kernels(npugraph, start)] == ["aten::mm"]
    assert torch.allclose(y.cpu(), x.cpu() @ w.cpu())


def test_unsafe_view_on_another_stream_is_no_read(npugraph):
    """A metadata op on a side stream touches no bytes: no race with the producer's stream (the
    general path recorded ``_unsafe_view`` as a task reading its input)."""
    y = torch.randn(6, 4).npu() * 2
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        v = torch.ops.aten._unsafe_view(y, [24])
    assert v._block is y._block
    npugraph.assert_clean()


# ------------------------------------------------------------------- spans
@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=4), dtype=st.sampled_from([torch.float32, torch.int8,
                                                                                          torch.float16]),
       offset=st.integers(0, 3))
def test_the_dense_span_is_the_layout_walks_span(shape, dtype, offset):
    base = torch.zeros(offset + max(1, torch.Size(shape).numel()), dtype=dtype)
    payload = base[offset:offset + torch.Size(shape).numel()].view(shape)
    block = type("Block", (), {"device": 0, "bid": 7, "lo": 4096})()
    t = npu_tensor.NpuTensor(payload, 0, block)
    size = payload.element_size()
    walked = None if payload.numel() == 0 else T.Span.of_view(0, 7, 4096 + payload.storage_offset() * size, size,
                                                              payload.shape, payload.stride())
    assert npu_tensor.span(t) == walked


def test_a_strided_view_keeps_its_runs(npugraph):
    x = torch.randn(4, 8).npu()
    s = npu_tensor.span(x[:, ::2])
    assert s.dims and s.run == 4


# ------------------------------------------------------------------- sites
def test_one_call_site_is_one_site_object(npugraph):
    x = torch.randn(4).npu()
    for _ in range(3):
        x.add_(1)
    sites = {id(k.site) for k in kernels(npugraph) if k.op == "aten::add_.Tensor"}
    assert len(sites) == 1


def test_exec_d_sources_sharing_a_file_name_keep_their_own_lines(npugraph):
    """Code objects of one file name and first line (exec'd text, Dynamo's transformed code) differ
    in their lines: the site is looked up by code object, not by file and offset."""
    space = {"torch": torch, "x": torch.randn(4).npu()}
    exec(compile("x.add_(1)", "<string>", "exec"), space)
    exec(compile("\n\nx.add_(2)", "<string>", "exec"), space)
    assert [k.site.line for k in kernels(npugraph) if k.op == "aten::add_.Tensor"] == [1, 3]


# ---------------------------------------------------------- storage table
def test_the_storage_table_forgets_dead_blocks_and_keeps_live_ones(npugraph):
    """Payload storages map to their blocks through weak references without callbacks; dead entries
    are swept as the table grows, live ones stay (a lost entry would give one storage two blocks)."""
    keep = [torch.randn(4).npu() for _ in range(100)]
    for _ in range(3 * npu_tensor._SWEEP_MIN):
        torch.randn(3).npu()          # each dies at once: a dead entry (unless the CPU reuses the address)
    assert len(npu_tensor._storage_blocks) < 2 * npu_tensor._sweep_at
    assert npu_tensor._sweep_at < 4 * npu_tensor._SWEEP_MIN
    for t in keep:
        assert npu_tensor.block_of_storage(t._payload.untyped_storage().data_ptr()) is t._block
        assert t.view(2, 2)._block is t._block and (t + 0)[:2]._block is not t._block
