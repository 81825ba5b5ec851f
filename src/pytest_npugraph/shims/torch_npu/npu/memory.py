"""Device memory statistics and the caching allocator (mirrors ``torch_npu/npu/memory.py``)."""
from __future__ import annotations

import collections
import warnings

import torch

import torch_npu
from torch_npu import _C
from pytest_npugraph.runtime.errors import ErrCode, pta_error
from pytest_npugraph.runtime.runtime import current
from .utils import _get_device_index


def _allocator(device=None):
    index = _get_device_index(device, optional=True)
    return current().devices[index].allocator


def memory_stats(device=None) -> "collections.OrderedDict":
    return _allocator(device).stats.as_dict()


def memory_stats_as_nested_dict(device=None) -> dict:
    nested: dict = {}
    for key, value in memory_stats(device).items():
        node = nested
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_cached(device=None) -> int:
    warnings.warn("torch_npu.npu.memory_cached has been renamed to torch_npu.npu.memory_reserved",
                  DeprecationWarning)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    warnings.warn("torch_npu.npu.max_memory_cached has been renamed to torch_npu.npu.max_memory_reserved",
                  DeprecationWarning)
    return max_memory_reserved(device)


def reset_peak_memory_stats(device=None) -> None:
    _allocator(device).stats.reset_peaks()


def reset_accumulated_memory_stats(device=None) -> None:
    _allocator(device).stats.reset_accumulated()


def reset_max_memory_allocated(device=None) -> None:
    warnings.warn("torch_npu.npu.reset_max_memory_allocated now calls torch_npu.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", DeprecationWarning)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None) -> None:
    warnings.warn("torch_npu.npu.reset_max_memory_cached now calls torch_npu.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", DeprecationWarning)
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Release cached blocks of every device back to the (emulated) device."""
    for device in current().devices:
        device.allocator.empty_cache()


def host_empty_cache() -> None:
    pass


def empty_virt_addr_cache() -> None:
    pass


def mem_get_info(device=None):
    index = _get_device_index(device, optional=True)
    if index < 0 or index >= torch_npu.npu.device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))
    allocator = current().devices[index].allocator
    return allocator.capacity - allocator.reserved, allocator.capacity


def set_per_process_memory_fraction(fraction, device=None) -> None:
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`" + pta_error(ErrCode.TYPE))
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1" + pta_error(ErrCode.VALUE))
    _allocator(device).fraction = fraction


def get_per_process_memory_fraction(device=None) -> float:
    return _allocator(device).fraction


_raw_blocks: dict = {}


def caching_allocator_alloc(size, device=None, stream=None) -> int:
    rt = current()
    index = _get_device_index(device, optional=True)
    if stream is None:
        state = rt.current_stream(index)
    elif isinstance(stream, torch_npu.npu.Stream):
        state = stream._state
    elif isinstance(stream, int):
        state = rt.current_stream(index)
    else:
        raise TypeError("Invalid type for stream argument, must be `torch_npu.npu.Stream` or `int` representing "
                        "a pointer to a existing stream" + pta_error(ErrCode.TYPE))
    block = rt.devices[index].allocator.malloc(size, state.sid)
    rt.on_alloc(block)
    _raw_blocks[block.lo] = block
    return block.lo


def caching_allocator_delete(mem_ptr) -> None:
    block = _raw_blocks.pop(mem_ptr, None)
    if block is not None:
        block.allocator.free(block)


def memory_snapshot(mempool_id=None) -> list:
    segments = []
    for device in current().devices:
        for seg in device.allocator.segments:
            segments.append({
                "device": device.index, "address": seg.lo, "total_size": seg.size,
                "stream": seg.stream, "segment_type": "small" if seg.small else "large",
                "allocated_size": sum(c.size for c in seg.blocks if c.owner is not None),
                "blocks": [{"address": c.lo, "size": c.size,
                            "state": "active_allocated" if c.owner is not None else
                            ("active_pending_free" if c.pending else "inactive")} for c in seg.blocks],
            })
    return segments


def memory_summary(device=None, abbreviated=False) -> str:
    stats = memory_stats(device)
    lines = ["|" + "=" * 60 + "|", "|" + " PyTorch NPU memory summary (pytest-npugraph emulation)".ljust(60) + "|"]
    for key in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        cur, peak = stats[f"{key}.all.current"], stats[f"{key}.all.peak"]
        lines.append(f"| {key:<22} current {cur:>12}  peak {peak:>12} |")
    lines.append("|" + "=" * 60 + "|")
    return "\n".join(lines)


def get_allocator_backend() -> str:
    return "native"
