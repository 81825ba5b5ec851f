"""The runtime logs its most frequent records (tasks, allocations, frees) as compact rows, which
``Trace.records`` and ``Trace.blocks`` make records of when read (trace.py, ``KERNEL_ROW``): what
analyses read is what the runtime would have recorded, and the rows cost the garbage collector
nothing (issue 14)."""
import gc
import inspect

import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T
from pytest_npugraph.runtime import tensor as npu_tensor


def line_of(marker: str) -> int:
    lines, _ = inspect.getsourcelines(inspect.getmodule(line_of))
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(marker))


def test_rows_become_the_records_the_runtime_would_have_made(npugraph):
    trace = npugraph.trace
    x = torch.randn(4, 6).npu()
    start = len(trace)
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        y = x[:, :3] * 2                                # mark: kernel
    del y                                               # mark: free
    assert all(type(row) is tuple for row in trace.log[start:])    # not made records before a read
    records = trace.records[start:]
    assert [type(r) for r in records] == [T.Alloc, T.Kernel, T.Free]
    assert [r.seq for r in records] == list(range(start, start + 3))
    alloc, kernel, free = records
    here = __file__.rsplit("/", 2)[-2:]
    assert kernel.site.path.endswith("/".join(here)) and kernel.site.line == line_of("# mark: kernel")
    assert kernel.site.func == "test_rows_become_the_records_the_runtime_would_have_made"
    assert alloc.site == kernel.site and free.site.line == line_of("# mark: free")
    assert kernel.op == "aten::mul.Tensor" and kernel.stream == side._state.sid == alloc_stream(trace, alloc)
    assert kernel.reads == (npu_tensor.span(x[:, :3]),) and kernel.reads[0].dims    # a strided read
    assert kernel.writes[0].block == alloc.block == free.block
    assert kernel.cores is npugraph.runtime.devices[0].profiles["aten::mul.Tensor"]
    assert (kernel.graph, kernel.collective) == (None, None)
    info = trace.blocks[alloc.block]
    assert type(info) is T.BlockInfo and info.site == kernel.site and info.size == 4 * 3 * 4
    assert (info.device, info.hi - info.lo, info.pool) == (0, 512, None)   # 4 x 3 floats, rounded up


def alloc_stream(trace, alloc):
    return trace.blocks[alloc.block].stream


def test_rows_are_not_tracked_by_the_garbage_collector(npugraph):
    x = torch.randn(4, 6).npu()
    for _ in range(50):
        x = x + 1
    x[:, :3] + 1                # a strided span: the most nested row
    for _ in range(6):          # the collector untracks a tuple once its items are: a pass per level
        gc.collect()
    rows = [row for row in npugraph.trace.log if type(row) is tuple]
    assert len(rows) >= 150
    assert not any(gc.is_tracked(row) for row in rows)
    assert not any(gc.is_tracked(row) for row in npugraph.trace.block_log.values())


def test_records_share_one_span_object_per_span(npugraph):
    x = torch.randn(16).npu()
    x + x, x * 2
    kernels = [r for r in npugraph.trace.records if isinstance(r, T.Kernel)][-2:]
    assert kernels[0].reads[0] is kernels[0].reads[1] is kernels[1].reads[0]


def test_records_read_midway_and_later_rows(npugraph):
    trace = npugraph.trace
    x = torch.randn(8).npu()
    first = list(trace.records)
    prefix = trace.with_records(trace.records[:])
    y = x + 1
    assert trace.records[:len(first)] == first and isinstance(trace.records[-1], T.Kernel)
    assert y._block.bid in prefix.blocks and type(prefix.blocks[y._block.bid]) is T.BlockInfo
    assert not any(type(r) is tuple for r in trace.records)


def test_a_trace_built_by_hand_reads_as_before():
    site = T.Site("a.py", 3)
    records = [T.Kernel(0, 1, "aten::mm", site=site), T.Free(1, 5, site)]
    trace = T.Trace(records, blocks={5: T.BlockInfo(5, 0, 1, 0, 512, 512, site)})
    assert trace.records is records and len(trace) == 2 and trace.next_seq == 2
    assert trace.blocks[5].site is site
    trace.append(T.Free(2, 5, site))
    assert trace.records[-1] == T.Free(2, 5, site)


def test_intern_is_by_identity():
    trace = T.Trace()
    a, b = T.Site("a.py", 1), T.Site("a.py", 1)
    assert trace.intern(a) == trace.intern(a) == 0 and trace.intern(b) == 1
    assert trace.objects == [a, b] and trace.objects[1] is b


def test_blocks_makes_the_new_rows_records_whatever_was_added_between_reads():
    trace = T.Trace()
    site = T.Site("a.py", 1)
    i = trace.intern(site)
    trace.block_log[1] = (1, 0, 7, 0, 512, 500, i, None)
    assert trace.blocks[1] == T.BlockInfo(1, 0, 7, 0, 512, 500, site)
    trace.blocks[2] = T.BlockInfo(2, 0, 7, 512, 1024, 512, site)       # by hand, between rows
    trace.block_log[3] = (3, 1, 8, 0, 1024, 1000, i, "(1, 0)")
    trace.block_log[4] = (4, 1, 8, 1024, 2048, 1000, i, None)
    assert trace.blocks[3] == T.BlockInfo(3, 1, 8, 0, 1024, 1000, site, "(1, 0)")
    assert all(type(info) is T.BlockInfo for info in trace.blocks.values()) and len(trace.blocks) == 4
