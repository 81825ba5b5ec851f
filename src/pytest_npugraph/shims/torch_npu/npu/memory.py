"""Device memory statistics and the caching allocator (mirrors ``torch_npu/npu/memory.py``)."""
from __future__ import annotations

import collections
import warnings

import torch_npu
from torch_npu import _C
from pytest_npugraph.runtime.errors import ErrCode, pta_error
from .utils import _get_device_index


def _allocator(device=None):
    return _C._allocator(_get_device_index(device, optional=True))


def memory_stats(device=None) -> "collections.OrderedDict":
    """Flat ``"<stat>.<pool>.<metric>"`` statistics of the device's caching allocator."""
    result = []

    def flatten(prefix, obj):
        if isinstance(obj, dict):
            for key, value in obj.items():
                flatten(f"{prefix}.{key}" if prefix else key, value)
        else:
            result.append((prefix, obj))

    flatten("", memory_stats_as_nested_dict(device=device))
    result.sort()
    return collections.OrderedDict(result)


def memory_stats_as_nested_dict(device=None) -> dict:
    if not torch_npu.npu.is_initialized():
        return {}
    return _allocator(device).stats.as_nested_dict()


def _all_pools(device, array: str, metric: str) -> int:
    """``memory_stats(device).get(f"{array}.all.{metric}", 0)`` without flattening every statistic
    (about 100 us; tests read these after every step)."""
    if not torch_npu.npu.is_initialized():
        return 0
    return getattr(_allocator(device).stats.values[array]["all"], metric)


def memory_allocated(device=None) -> int:
    return _all_pools(device, "allocated_bytes", "current")


def max_memory_allocated(device=None) -> int:
    return _all_pools(device, "allocated_bytes", "peak")


def memory_reserved(device=None) -> int:
    return _all_pools(device, "reserved_bytes", "current")


def max_memory_reserved(device=None) -> int:
    return _all_pools(device, "reserved_bytes", "peak")


def memory_cached(device=None) -> int:
    warnings.warn("torch_npu.npu.memory_cached has been renamed to torch_npu.npu.memory_reserved",
                  DeprecationWarning)
    return memory_reserved(device=device)


def max_memory_cached(device=None) -> int:
    warnings.warn("torch_npu.npu.max_memory_cached has been renamed to torch_npu.npu.max_memory_reserved",
                  DeprecationWarning)
    return max_memory_reserved(device=device)


def reset_peak_memory_stats(device=None) -> None:
    _allocator(device).stats.reset_peaks()


def reset_accumulated_memory_stats(device=None) -> None:
    _allocator(device).stats.reset_accumulated()


def reset_max_memory_allocated(device=None) -> None:
    warnings.warn("torch_npu.npu.reset_max_memory_allocated now calls torch_npu.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", DeprecationWarning)
    return reset_peak_memory_stats(device=device)


def reset_max_memory_cached(device=None) -> None:
    warnings.warn("torch_npu.npu.reset_max_memory_cached now calls torch_npu.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", DeprecationWarning)
    return reset_peak_memory_stats(device=device)


def empty_cache() -> None:
    """Release the cached unused blocks of every device (a no-op before NPU initialisation)."""
    if torch_npu.npu.is_initialized():
        _C._npu_emptyCache()


def host_empty_cache() -> None:
    pass


def empty_virt_addr_cache() -> None:
    pass


def mem_get_info(device=None):
    if device is None:
        device = torch_npu.npu.current_device()
    index = _get_device_index(device, optional=True)
    if index < 0 or index >= torch_npu.npu.device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))
    torch_npu.npu._lazy_init()
    allocator = _C._allocator(index)
    return allocator.capacity - allocator.reserved, allocator.capacity


def set_per_process_memory_fraction(fraction, device=None) -> None:
    torch_npu.npu._lazy_init()
    if device is None:
        device = torch_npu.npu.current_device()
    device = _get_device_index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`" + pta_error(ErrCode.TYPE))
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1" + pta_error(ErrCode.VALUE))
    _C._allocator(device).fraction = fraction


def get_per_process_memory_fraction(device=None) -> float:
    torch_npu.npu._lazy_init()
    if device is None:
        device = torch_npu.npu.current_device()
    return _C._allocator(_get_device_index(device)).fraction


def caching_allocator_alloc(size, device=None, stream=None) -> int:
    """Allocate ``size`` bytes from the caching allocator; free with ``caching_allocator_delete``."""
    if device is None:
        device = torch_npu.npu.current_device()
    device = _get_device_index(device)
    if stream is None:
        stream = torch_npu.npu.current_stream(device)
    if isinstance(stream, torch_npu.npu.streams.Stream):
        stream = stream.npu_stream
    if not isinstance(stream, int):
        raise TypeError("Invalid type for stream argument, must be `torch_npu.npu.Stream` or `int` representing "
                        "a pointer to a existing stream" + pta_error(ErrCode.TYPE))
    with torch_npu.npu.device(device):
        return _C._npu_npuCachingAllocator_raw_alloc(size, stream)


def caching_allocator_delete(mem_ptr) -> None:
    _C._npu_npuCachingAllocator_raw_delete(mem_ptr)


def memory_snapshot(mempool_id=None) -> list:
    """The allocator's segments (with their blocks) on every device."""
    return _C._npu_memorySnapshot(mempool_id)["segments"]


def _snapshot(device=None, augment_with_fx_traces=False) -> dict:
    return _C._npu_memorySnapshot(None)


_SUMMARY_ROWS = (   # (stat, label, in bytes)
    ("allocated_bytes", "Allocated memory", True), ("active_bytes", "Active memory", True),
    ("requested_bytes", "Requested memory", True), ("reserved_bytes", "NPU reserved memory", True),
    ("inactive_split_bytes", "Non-releasable memory", True), ("allocation", "Allocations", False),
    ("active", "Active allocs", False), ("segment", "NPU reserved segments", False),
    ("inactive_split", "Non-releasable allocs", False))


def _summary_cell(value: int, scale: int, in_bytes: bool) -> str:
    """A 10-wide cell: counts as they are; bytes in the unit the row's peak reads best in."""
    if not in_bytes:
        return f"{value:7d}   "
    unit = "B  "
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if scale < 768 * 1024:
            break
        unit, value, scale = bigger, value // 1024, scale / 1024
    return f"{value:6d} {unit}"


def memory_summary(device=None, abbreviated=False) -> str:
    """The allocator statistics as torch_npu prints them (the layout of ``torch.cuda.memory_summary``,
    with the NPU's names): a header with OOM and retry counts, then current / peak / total
    allocated / total freed per metric, split by pool unless ``abbreviated``."""
    device = _get_device_index(device, optional=True)
    stats = memory_stats(device)
    rule, thin = "=" * 75, "-" * 75
    lines = [rule, " {:16} PyTorch NPU memory summary, device ID {:<18d} ".format("", device), thin,
             "  {:9} NPU OOMs: {:<13d} | {:6} npuMalloc retries: {:<9d}  ".format(
                 "", stats.get("num_ooms", 0), "", stats.get("num_alloc_retries", 0)),
             rule, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    pools = (("all", ""),) if abbreviated else (("all", ""), ("large_pool", "      from large pool"),
                                                ("small_pool", "      from small pool"))
    for stat, label, in_bytes in _SUMMARY_ROWS:
        lines.append(thin)
        for pool, pool_label in pools:
            values = [stats.get(f"{stat}.{pool}.{field}", 0) for field in ("current", "peak", "allocated", "freed")]
            name = pool_label or label
            lines.append(" {:<21} | ".format(name) + " | ".join(
                _summary_cell(v, values[1] if k < 2 else v, in_bytes) for k, v in enumerate(values)) + " ")
    lines.append(thin)
    for stat, label in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize NPU segments")):
        values = [stats.get(f"{stat}.{field}", 0) for field in ("current", "peak", "allocated", "freed")]
        lines.append(" {:<21} | ".format(label) + " | ".join(_summary_cell(v, 0, False) for v in values) + " ")
    lines.append(rule)
    return "|" + "|\n|".join(lines) + "|\n"


def get_allocator_backend() -> str:
    return "native"


# ------------------------------------------------------------------ memory pools and allocators
class _MemPool:
    """``torch_npu._C._MemPool``: a pool id ``(0, n)`` from the same counter as ``graph_pool_handle()``."""

    def __init__(self, allocator=None, is_user_created=True, use_on_oom=False, no_split=False):
        from pytest_npugraph.runtime import graphs as _graphs
        from pytest_npugraph.runtime.runtime import current

        self._id = _graphs.pool_handle(current())
        self._allocator = allocator
        self.use_on_oom, self.no_split = use_on_oom, no_split
        self._users = 1

    @property
    def id(self) -> tuple:
        return self._id

    @property
    def allocator(self):
        return self._allocator

    def use_count(self) -> int:
        return self._users


class MemPool(_MemPool):
    """A memory pool of the caching allocator: allocations made inside ``use_mem_pool(pool)`` by the calling
    thread come from (and are cached in) this pool, as in torch_npu (``.id``, ``.use_count()``, ``.snapshot()``)."""

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        super().__init__(None if allocator is None else getattr(allocator, "allocator", lambda: allocator)(),
                         True, use_on_oom, no_split)

    def snapshot(self):
        return memory_snapshot(self.id)


class use_mem_pool:
    """Route the calling thread's allocations on ``device`` (the current one by default) into ``pool``."""

    def __init__(self, pool: MemPool, device=None):
        if not isinstance(pool, MemPool):
            raise TypeError(f"use_mem_pool(): pool must be a torch.npu.MemPool, got {type(pool).__name__}")
        self.pool = pool
        self.device_index = _get_device_index(device, optional=True)

    def __enter__(self):
        from pytest_npugraph.runtime.runtime import current

        self._previous = current().route_pool(self.device_index, self.pool.id)
        self.pool._users += 1
        return self.pool

    def __exit__(self, *exc):
        from pytest_npugraph.runtime.runtime import current

        current().route_pool(self.device_index, self._previous)
        self.pool._users -= 1
        return False


class _NPUAllocator:
    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


class NPUPluggableAllocator(_NPUAllocator):
    """An allocator loaded from a shared library (``so_path`` with ``alloc_fn_name``/``free_fn_name``).
    The emulated device keeps its own caching allocator: the library is checked for existence and its
    functions are not called (there is no device memory to hand them)."""

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str):
        import os

        if not os.path.exists(path_to_so_file):
            raise RuntimeError(f"Cannot find allocator library {path_to_so_file}" + pta_error(ErrCode.NOT_FOUND))
        self.path, self.alloc_fn_name, self.free_fn_name = path_to_so_file, alloc_fn_name, free_fn_name
        super().__init__(self)


def change_current_allocator(allocator) -> None:
    """Accepted before the first allocation, as in torch_npu; the emulated caching allocator stays in use."""
    if not isinstance(allocator, _NPUAllocator):
        raise TypeError("change_current_allocator() argument must be an NPUPluggableAllocator")


def _host_stats() -> dict:
    from pytest_npugraph.runtime.runtime import current

    return current().extensions.setdefault("host_memory_stats", collections.OrderedDict())


def host_memory_stats() -> "collections.OrderedDict":
    """Statistics of the pinned host allocator (counters are kept by ``runtime.pinned``)."""
    return collections.OrderedDict(sorted(_host_stats().items()))


def host_memory_stats_as_nested_dict() -> dict:
    return dict(_host_stats())


def reset_accumulated_host_memory_stats() -> None:
    _host_stats().clear()


def reset_peak_host_memory_stats() -> None:
    pass
