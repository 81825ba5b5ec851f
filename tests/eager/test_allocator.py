"""The caching allocator and torch.npu memory APIs against torch_npu 2.14.0 (torch_npu_api.md §5)."""
import gc
import re

import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SMALL_SEGMENT, LARGE_SEGMENT = 2 * MiB, 20 * MiB


def floats(n, **kw):
    return torch.empty(n, dtype=torch.float32, device="npu", **kw)


def test_stats_follow_allocations_and_frees(npugraph):
    assert torch.npu.memory_allocated() == torch.npu.memory_reserved() == 0
    x = floats(1000)                                          # 4000 B, rounded to 512 B blocks
    assert torch.npu.memory_allocated() == 4096
    assert torch.npu.memory_reserved() == SMALL_SEGMENT
    y = floats(3 * MiB // 4)                                  # 3 MiB: the large pool
    assert torch.npu.memory_allocated() == 4096 + 3 * MiB
    assert torch.npu.memory_reserved() == SMALL_SEGMENT + LARGE_SEGMENT
    del x
    assert torch.npu.memory_allocated() == 3 * MiB
    assert torch.npu.max_memory_allocated() == 4096 + 3 * MiB
    del y
    assert torch.npu.memory_allocated() == 0
    assert torch.npu.memory_reserved() == SMALL_SEGMENT + LARGE_SEGMENT    # cached, not released
    assert torch.npu.max_memory_reserved() == SMALL_SEGMENT + LARGE_SEGMENT
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == 0
    assert torch.npu.max_memory_reserved() == SMALL_SEGMENT + LARGE_SEGMENT


def test_huge_requests_get_their_own_rounded_segment(npugraph):
    x = torch.empty(25 * MiB + 1, dtype=torch.uint8, device="npu")
    assert torch.npu.memory_reserved() == 26 * MiB                # rounded up to 2 MiB
    assert torch.npu.memory_allocated() == 26 * MiB               # a large block splits off > 1 MiB only
    assert torch.npu.memory_stats()["requested_bytes.all.current"] == 25 * MiB + 1
    y = torch.empty(30 * MiB, dtype=torch.uint8, device="npu")
    del x, y
    z = torch.empty(12 * MiB, dtype=torch.uint8, device="npu")    # best fit: the 26 MiB segment, split
    assert torch.npu.memory_allocated() == 12 * MiB
    assert torch.npu.memory_reserved() == 56 * MiB
    del z


def test_tensors_freed_by_the_garbage_collector(npugraph):
    holders = []
    for i in range(40):
        cycle = {"tensor": torch.empty(100 + i, device="npu")}
        cycle["self"] = cycle                                     # only the GC can free it
        holders.append(cycle)
    del cycle
    holders.clear()
    gc.collect()
    assert torch.npu.memory_allocated() == 0
    assert torch.npu.memory_stats()["active.all.current"] == 0
    x = floats(1024)
    assert torch.npu.memory_stats()["inactive_split.all.current"] == 1   # the pool merged back whole
    del x


def test_views_share_their_base_allocation(npugraph):
    x = floats(1024)
    views = [x[1:], x.view(32, 32), x.t() if x.dim() == 2 else x[::2]]
    assert torch.npu.memory_allocated() == 4096
    del x
    assert torch.npu.memory_allocated() == 4096                  # the views keep the block alive
    del views
    assert torch.npu.memory_allocated() == 0


def test_peaks_and_reset(npugraph):
    a = floats(256 * KiB)                                         # 1 MiB
    b = floats(256 * KiB)
    del a, b
    assert torch.npu.max_memory_allocated() == 2 * MiB
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == 0
    c = floats(128)
    assert torch.npu.max_memory_allocated() == 512
    stats = torch.npu.memory_stats()
    assert stats["allocation.all.allocated"] == 3 and stats["allocation.all.freed"] == 2
    torch.npu.reset_accumulated_memory_stats()
    stats = torch.npu.memory_stats()
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == 0
    assert stats["allocation.all.current"] == 1
    del c


def test_memory_stats_keys(npugraph):
    x = floats(100)
    y = floats(1 << 20)                                           # 4 MiB, large pool
    stats = torch.npu.memory_stats()
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
                 "allocation", "segment", "active", "inactive_split"):
        for pool in ("all", "large_pool", "small_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{metric}" in stats
    for key in ("num_alloc_retries", "num_ooms", "num_oom_rejections", "num_sync_all_streams",
                "num_device_alloc", "num_device_free", "max_split_size", "oversize_allocations.current",
                "oversize_segments.peak"):
        assert key in stats
    assert "allocated.all.current" not in stats                   # the docstring's name is wrong
    assert list(stats) == sorted(stats)
    assert stats["allocation.all.current"] == 2
    assert stats["allocation.small_pool.current"] == stats["allocation.large_pool.current"] == 1
    assert stats["requested_bytes.all.current"] == 400 + 4 * MiB
    assert stats["segment.all.current"] == 2 and stats["num_device_alloc"] == 2
    assert stats["inactive_split.small_pool.current"] == 1        # the rest of the 2 MiB segment
    assert stats["inactive_split_bytes.small_pool.current"] == SMALL_SEGMENT - 512
    nested = torch.npu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    del x, y


def test_deprecated_names_warn(npugraph):
    floats(10)
    with pytest.warns(DeprecationWarning, match="torch_npu.npu.memory_cached has been renamed to "
                                                "torch_npu.npu.memory_reserved"):
        assert torch.npu.memory_cached() == torch.npu.memory_reserved()
    with pytest.warns(DeprecationWarning, match="max_memory_cached has been renamed"):
        assert torch.npu.max_memory_cached() == torch.npu.max_memory_reserved()
    with pytest.warns(DeprecationWarning, match="reset_max_memory_allocated now calls"):
        torch.npu.reset_max_memory_allocated()
    with pytest.warns(DeprecationWarning, match="reset_max_memory_cached now calls"):
        torch.npu.reset_max_memory_cached()


# ------------------------------------------------------------------ block reuse
def test_freed_block_is_reused_on_the_same_stream(npugraph):
    x = floats(1024)
    ptr = x.data_ptr()
    del x
    y = floats(1024)
    assert y.data_ptr() == ptr
    z = floats(1024)
    assert z.data_ptr() == ptr + 4096                             # split from the same segment


def test_no_reuse_across_streams(npugraph):
    s = torch.npu.Stream()
    x = floats(1024)
    ptr = x.data_ptr()
    del x
    with torch.npu.stream(s):
        y = floats(1024)
    assert y.data_ptr() != ptr
    assert torch.npu.memory_reserved() == 2 * SMALL_SEGMENT     # each stream has its own pool
    z = floats(1024)
    assert z.data_ptr() == ptr


def test_record_stream_defers_reuse_until_synchronize(npugraph):
    s = torch.npu.Stream()
    x = torch.ones(1024, device="npu")
    ptr = x.data_ptr()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        y = x * 2
    x.record_stream(s)
    del x
    z = floats(1024)
    assert z.data_ptr() != ptr                                    # s may still read it
    snap = torch.npu.memory_snapshot()
    states = {b["address"]: b["state"] for seg in snap for b in seg["blocks"]}
    assert states[ptr] == "active_pending_free"
    torch.npu.synchronize()
    w = floats(1024)
    assert w.data_ptr() == ptr
    torch.npu.current_stream().wait_stream(s)
    assert y.sum().item() == 2048.0
    npugraph.assert_clean()
    del z


def test_empty_cache_waits_for_pending_frees(npugraph):
    s = torch.npu.Stream()
    x = torch.ones(1024, device="npu")
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        x.sum()
    x.record_stream(s)
    del x
    assert torch.npu.memory_allocated() == 0
    assert torch.npu.memory_stats()["active.all.current"] == 1   # awaiting the event on s
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == 0
    assert torch.npu.memory_stats()["active.all.current"] == 0


def test_record_stream_on_the_allocation_stream_is_ignored(npugraph):
    x = floats(1024)
    ptr = x.data_ptr()
    x.record_stream(torch.npu.current_stream())
    del x
    assert floats(1024).data_ptr() == ptr


def test_reuse_is_recorded_in_the_trace(npugraph):
    x = floats(1024)
    del x
    y = floats(1024)  # noqa: F841
    allocs = [r for r in npugraph.trace.records if isinstance(r, T.Alloc)]
    frees = [r for r in npugraph.trace.records if isinstance(r, T.Free)]
    assert len(allocs) == 2 and len(frees) == 1
    assert allocs[1].reuses == allocs[0].block == frees[0].block


# ------------------------------------------------------------------ raw allocations
def test_caching_allocator_alloc_and_delete(npugraph):
    ptr = torch.npu.caching_allocator_alloc(1000)
    assert isinstance(ptr, int) and ptr > 0
    assert torch.npu.memory_allocated() == 1024
    torch.npu.caching_allocator_delete(ptr)
    assert torch.npu.memory_allocated() == 0
    torch.npu.empty_cache()
    s = torch.npu.Stream()
    on_s = torch.npu.caching_allocator_alloc(512, stream=s)
    by_pointer = torch.npu.caching_allocator_alloc(512, device=0, stream=s.npu_stream)
    snap = {seg["address"]: seg["stream"] for seg in torch.npu.memory_snapshot()}
    assert set(snap.values()) == {s.npu_stream}                   # both on s's pool
    assert by_pointer == on_s + 512
    for p in (on_s, by_pointer):
        torch.npu.caching_allocator_delete(p)


@pytest.mark.parametrize("stream", ["npu", 1.5, torch.npu.Event])
def test_caching_allocator_alloc_stream_type(npugraph, stream):
    with pytest.raises(TypeError) as info:
        torch.npu.caching_allocator_alloc(64, stream=stream)
    assert str(info.value).startswith("Invalid type for stream argument, must be `torch_npu.npu.Stream` or `int` "
                                      "representing a pointer to a existing stream")


def test_caching_allocator_delete_unknown_pointer(npugraph):
    torch.npu.caching_allocator_delete(0)                          # null: no-op
    with pytest.raises(RuntimeError, match="^invalid device pointer"):
        torch.npu.caching_allocator_delete(12345)


def test_memory_snapshot_structure(npugraph):
    assert torch.npu.memory_snapshot() == []
    x = floats(1000)
    (seg,) = torch.npu.memory_snapshot()
    assert seg["device"] == 0 and seg["segment_type"] == "small" and seg["total_size"] == SMALL_SEGMENT
    assert seg["stream"] == torch.npu.current_stream().npu_stream
    assert seg["allocated_size"] == seg["active_size"] == 4096 and seg["requested_size"] == 4000
    first, rest = seg["blocks"]
    assert first == {"address": x.data_ptr(), "size": 4096, "requested_size": 4000, "state": "active_allocated",
                     "frames": []}
    assert rest["state"] == "inactive" and rest["size"] == SMALL_SEGMENT - 4096
    assert seg["address"] == x.data_ptr()
    del x
    (seg,) = torch.npu.memory_snapshot()
    assert [b["state"] for b in seg["blocks"]] == ["inactive"] and seg["allocated_size"] == 0


def test_memory_summary_has_torch_npus_layout(npugraph):
    """The header torch_npu's own test_memory_summary_format checks, then one row per metric."""
    live = floats(10)
    summary = torch.npu.memory_summary()
    lines = summary.splitlines()
    assert all(len(line) == 77 and line[0] == line[-1] == "|" for line in lines)
    assert lines[1] == "|" + " " * 18 + "PyTorch NPU memory summary, device ID 0" + " " * 18 + "|"
    assert lines[3] == "|" + " " * 12 + "NPU OOMs: 0             |        npuMalloc retries: 0          |"
    assert lines[5] == "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |"
    allocated = next(line for line in lines if line.startswith("| Allocated memory"))
    assert allocated.split("|")[2].strip() == "512 B"          # one 512-byte block, current
    short = torch.npu.memory_summary(abbreviated=True)
    assert "from large pool" in summary and "from large pool" not in short
    del live


# ------------------------------------------------------------------ fraction and OOM
@pytest.mark.parametrize("fraction", [1, "0.5", None])
def test_memory_fraction_type(npugraph, fraction):
    with pytest.raises(TypeError, match="^Invalid type for fraction argument, must be `float`"):
        torch.npu.set_per_process_memory_fraction(fraction)


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_memory_fraction_range(npugraph, fraction):
    with pytest.raises(ValueError) as info:
        torch.npu.set_per_process_memory_fraction(fraction)
    assert str(info.value).startswith(f"Invalid fraction value: {fraction}. Allowed range: 0~1")


def test_memory_fraction_limits_the_allocator(npugraph):
    assert torch.npu.get_per_process_memory_fraction() == 1.0
    torch.npu.set_per_process_memory_fraction(0.5)
    assert torch.npu.get_per_process_memory_fraction() == 0.5
    with pytest.raises(torch.OutOfMemoryError, match="^NPU out of memory. Tried to allocate"):
        torch.empty(33 * GiB, dtype=torch.uint8, device="npu")


@pytest.mark.npu_chip("Ascend910B4")
def test_out_of_memory(npugraph):
    keep = torch.empty(8 * MiB, dtype=torch.uint8, device="npu")
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(40 * GiB, dtype=torch.uint8, device="npu")
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert message.startswith("NPU out of memory. Tried to allocate 40.00 GiB (NPU 0; 32.00 GiB total capacity; "
                              "8.00 MiB already allocated; 8.00 MiB current active; ")
    assert re.search(r"20\.00 MiB reserved in total by PyTorch\)", message)
    stats = torch.npu.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1
    assert torch.npu.memory_allocated() == 8 * MiB                  # nothing leaked
    del keep


def test_out_of_memory_frees_the_cache_first(npugraph):
    torch.npu.set_per_process_memory_fraction(30 * MiB / (64 * GiB))
    a = torch.empty(10 * MiB, dtype=torch.uint8, device="npu")     # a 20 MiB segment
    del a
    b = torch.empty(24 * MiB, dtype=torch.uint8, device="npu")     # fits once the cached segment is freed
    assert torch.npu.memory_reserved() == 24 * MiB
    assert torch.npu.memory_stats()["num_alloc_retries"] == 1
    del b


def test_more_than_an_exabyte(npugraph):
    with pytest.raises(torch.OutOfMemoryError, match=r"^NPU out of memory\. Tried to allocate more than 1EB "
                                                     r"memory\."):
        torch.empty(1 << 61, dtype=torch.uint8, device="npu")


def test_mem_get_info(npugraph):
    free, total = torch.npu.mem_get_info()
    assert total == 64 * GiB and free == total
    x = floats(10)
    assert torch.npu.mem_get_info(0) == (total - SMALL_SEGMENT, total)
    del x


@pytest.mark.npu_devices(2)
def test_each_device_has_its_own_allocator(npugraph):
    x = torch.empty(1024, device="npu:1")
    assert torch.npu.memory_allocated(1) == 4096 and torch.npu.memory_allocated("npu:1") == 4096
    assert torch.npu.memory_allocated(0) == torch.npu.memory_allocated() == 0
    with torch.npu.device(1):
        assert torch.npu.memory_allocated() == 4096
        y = torch.empty(1024, device="npu")
    assert y.device.index == 1 and x.data_ptr() != y.data_ptr()
    assert {seg["device"] for seg in torch.npu.memory_snapshot()} == {1}
    del x, y


def test_memory_is_fresh_in_each_test(npugraph):
    gc.collect()
    assert torch.npu.memory_allocated() == 0 and torch.npu.max_memory_reserved() == 0
    assert torch.npu.memory_snapshot() == []


def _line_of(marker: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(test_a_free_names_the_line_that_dropped_the_last_reference)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def test_a_free_names_the_line_that_dropped_the_last_reference(npugraph):
    def drop(t):
        del t                                                     # not here: the caller still holds it
    x = floats(1024)
    drop(x)
    del x                                                         # FREE-X
    y = floats(256)
    y = y + 1                                                     # FREE-Y (the old y goes here)
    frees = [r for r in npugraph.trace.records if isinstance(r, T.Free)]
    assert [f.site.line for f in frees] == [_line_of("# FREE-X"), _line_of("# FREE-Y")]
    assert all(f.site.path.endswith("test_allocator.py") for f in frees)


def test_a_block_over_several_freed_blocks_names_the_newest_of_them(npugraph):
    a, b, c = floats(128), floats(128), floats(128)               # 512 B each, side by side
    bids = [npugraph.trace.blocks[r.block].lo for r in npugraph.trace.records if isinstance(r, T.Alloc)]
    assert bids == sorted(bids) and len(set(bids)) == 3
    del c, a, b
    big = floats(384)                                             # 1536 B: over all three
    allocs = [r for r in npugraph.trace.records if isinstance(r, T.Alloc)]
    assert allocs[-1].reuses == allocs[2].block                   # c's: the newest of the three
    again = floats(128)                                           # nothing freed is left to reuse
    assert [r for r in npugraph.trace.records if isinstance(r, T.Alloc)][-1].reuses is None
    del big, again


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_blocks_dying_in_autograds_device_thread_are_freed(npugraph):
    """Backward frees saved tensors in autograd's thread for the device, where no Python frame lies
    above the dying Block: it is freed all the same (it leaked, and pytest saw an unraisable error)."""
    w = torch.randn(8, 8, device="npu", requires_grad=True)
    base = torch.npu.memory_allocated()
    for _ in range(3):
        loss = (w @ w).relu().sum()
        loss.backward()
        del loss
    w.grad = None
    assert torch.npu.memory_allocated() == base


def test_the_single_figures_are_memory_stats_entries(npugraph):
    """``memory_allocated`` and co. read one statistic directly (flattening all of them cost 100 us per
    call); they must say what ``memory_stats()`` says, before the device is used too."""
    def figures():
        return (torch.npu.memory_allocated(), torch.npu.max_memory_allocated(), torch.npu.memory_reserved(),
                torch.npu.max_memory_reserved())

    def from_stats():
        stats = torch.npu.memory_stats()
        return tuple(stats.get(name, 0) for name in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                                                     "reserved_bytes.all.current", "reserved_bytes.all.peak"))
    assert figures() == from_stats() == (0, 0, 0, 0)
    x, y = floats(1000), floats(3 * MiB)
    del x
    torch.npu.empty_cache()
    assert figures() == from_stats() and figures()[0] == 12 * MiB and figures()[1] > figures()[0]
