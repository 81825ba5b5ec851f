"""The shortcuts of the per-op path (issue 14) record what the general path records.

Each shortcut skips work on the common case: a view of one tensor skips the general dispatch,
a contiguous tensor's span skips the layout walk, a call site's ``Site`` is made once, tensor lists
(``index``, ``index_put_``, ``cat``, ``stack``) are taken in ``_run``'s loop.  These tests pin that the
trace, the reports and the results stay the same.
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


# ------------------------------------------------------- tensor-list arguments
# ``index``'s indices (``Tensor?[]``), ``index_put_``'s, ``cat``'s and ``stack``'s tensors are taken in
# ``_run``'s argument loop, not by ``_Operands.take``: they must record the same reads and writes.
def spans_of(*tensors):
    return [npu_tensor.span(t) for t in tensors]


def one_kernel(npugraph, start, op):
    ks = [k for k in kernels(npugraph, start) if k.op == op]
    assert len(ks) == 1, [k.op for k in kernels(npugraph, start)]
    return ks[0]


def test_index_reads_the_tensor_and_every_index(npugraph):
    x, i, j = torch.randn(5, 6).npu(), torch.tensor([0, 3, 4]).npu(), torch.tensor([1, 1, 5]).npu()
    start = len(npugraph.trace)
    y = x[i, j]
    k = one_kernel(npugraph, start, "aten::index.Tensor")
    assert list(k.reads) == spans_of(x, i, j) and list(k.writes) == spans_of(y)
    assert torch.equal(y.cpu(), x.cpu()[i.cpu(), j.cpu()])


def test_index_with_a_none_in_the_indices(npugraph):
    """``x[:, i]`` passes ``[None, i]``: the None stays a None, ``i`` is read."""
    x, i = torch.randn(5, 6).npu(), torch.tensor([0, 2, 5]).npu()
    start = len(npugraph.trace)
    y = x[:, i]
    k = one_kernel(npugraph, start, "aten::index.Tensor")
    assert list(k.reads) == spans_of(x, i)
    assert torch.equal(y.cpu(), x.cpu()[:, i.cpu()])
    z = torch.ops.aten.index.Tensor(x, [None, i])
    assert torch.equal(z.cpu(), x.cpu()[:, i.cpu()])


def test_index_with_a_bool_mask_reads_it_and_syncs_the_host(npugraph):
    x = torch.randn(4, 3).npu()
    mask = torch.tensor([True, False, True, True]).npu()
    start = len(npugraph.trace)
    y = x[mask]
    k = one_kernel(npugraph, start, "aten::index.Tensor")
    assert list(k.reads) == spans_of(x, mask)
    assert any(isinstance(r, T.HostSync) for r in npugraph.trace.records[start:])
    assert torch.equal(y.cpu(), x.cpu()[mask.cpu()])


def test_index_accepts_a_cpu_index_tensor_as_the_real_one_does(npugraph):
    """The index ops take host indices (``_HOST_OPERANDS_OK``): not read on the device."""
    x, i = torch.randn(5, 6).npu(), torch.tensor([4, 0])
    start = len(npugraph.trace)
    y = x[i]
    assert y.device == x.device
    k = one_kernel(npugraph, start, "aten::index.Tensor")
    assert list(k.reads) == spans_of(x)
    assert torch.equal(y.cpu(), x.cpu()[i])
    z = x[i, torch.tensor([1, 2]).npu()]          # a host index and a device one
    assert torch.equal(z.cpu(), x.cpu()[i, torch.tensor([1, 2])])


def test_cat_and_stack_refuse_a_cpu_tensor_among_npu_ones(npugraph):
    a, b = torch.randn(2, 3).npu(), torch.randn(2, 3)
    for op in (torch.cat, torch.stack):
        with pytest.raises(RuntimeError, match="same device, but found at least two devices, npu:0 and cpu!"):
            op([a, b])
        with pytest.raises(RuntimeError, match="same device, but found at least two devices, npu:0 and cpu!"):
            op((b, a))
    s = torch.stack([torch.tensor(1.0).npu(), torch.tensor(2.0)])   # a 0-dim host tensor is a scalar: accepted
    assert s.device == a.device and torch.equal(s.cpu(), torch.tensor([1.0, 2.0]))


def test_index_put_writes_its_self_and_reads_indices_and_values(npugraph):
    x, i, v = torch.zeros(5, 3).npu(), torch.tensor([1, 3]).npu(), torch.randn(2, 3).npu()
    want = x.cpu().index_put_((i.cpu(),), v.cpu())
    start = len(npugraph.trace)
    out = x.index_put_((i,), v)
    assert out is x
    k = one_kernel(npugraph, start, "aten::index_put_")
    assert list(k.writes) == spans_of(x) and list(k.reads) == spans_of(i, v)
    assert torch.equal(x.cpu(), want)
    start = len(npugraph.trace)
    x[i] = v * 2                                      # setitem: index_put_ too
    k = one_kernel(npugraph, start, "aten::index_put_")
    assert list(k.writes) == spans_of(x) and npu_tensor.span(i) in k.reads
    assert torch.equal(x.cpu()[i.cpu()], (v * 2).cpu())


@pytest.mark.parametrize("op", [torch.cat, torch.stack])
def test_cat_and_stack_read_every_input(npugraph, op):
    a, b, c = (torch.randn(2, 3).npu() for _ in range(3))
    start = len(npugraph.trace)
    y = op([a, b, c])
    k = one_kernel(npugraph, start, "aten::cat" if op is torch.cat else "aten::stack")
    assert list(k.reads) == spans_of(a, b, c) and list(k.writes) == spans_of(y)
    assert torch.equal(y.cpu(), op([a.cpu(), b.cpu(), c.cpu()]))


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_race_on_one_cat_input_is_reported(npugraph, which):
    inputs = [torch.randn(2, 3).npu() for _ in range(3)]
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        inputs[which].mul_(2)                          # written on the side stream, no wait back
    with npugraph.expect("race", match="aten::cat"):
        torch.cat(inputs)
    torch.npu.current_stream().wait_stream(side)
    npugraph.assert_clean()


def test_foreach_writes_every_tensor_of_its_list(npugraph):
    xs = [torch.randn(3).npu() for _ in range(2)]
    want = [x.cpu() + 1 for x in xs]
    start = len(npugraph.trace)
    torch._foreach_add_(xs, 1.0)
    k = one_kernel(npugraph, start, "aten::_foreach_add_.Scalar")
    assert list(k.writes) == spans_of(*xs) and not k.reads
    assert all(torch.equal(x.cpu(), w) for x, w in zip(xs, want))


def test_a_fake_payload_in_a_tensor_list_makes_a_fake_run(npugraph):
    """Fake payloads (a compiler's tracing) in the list: the op runs for shapes only and records no task."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(2, 3), torch.empty(2, 3)
    a, b = npu_tensor.wrap(a, 0), npu_tensor.wrap(b, 0)
    start = len(npugraph.trace)
    for op, shape in ((torch.cat, (4, 3)), (torch.stack, (2, 2, 3))):
        y = op([a, b])
        assert y.shape == shape and y.device == a.device and npu_tensor._is_fake(y._payload)
    assert not kernels(npugraph, start)
