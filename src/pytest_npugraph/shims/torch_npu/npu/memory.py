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


def memory_allocated(device=None) -> int:
    return memory_stats(device=device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None) -> int:
    return memory_stats(device=device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None) -> int:
    return memory_stats(device=device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None) -> int:
    return memory_stats(device=device).get("reserved_bytes.all.peak", 0)


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


def memory_summary(device=None, abbreviated=False) -> str:
    stats = memory_stats(device)
    lines = ["|" + "=" * 60 + "|", "|" + " PyTorch NPU memory summary (pytest-npugraph emulation)".ljust(60) + "|"]
    for key in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        cur, peak = stats.get(f"{key}.all.current", 0), stats.get(f"{key}.all.peak", 0)
        lines.append(f"| {key:<22} current {cur:>12}  peak {peak:>12} |")
    lines.append("|" + "=" * 60 + "|")
    return "\n".join(lines)


def get_allocator_backend() -> str:
    return "native"
