"""Emulated ``torch_npu.npu`` (registered as ``torch.npu``): devices, streams, events, memory,
core limits and graphs, backed by pytest-npugraph's per-test runtime."""
from __future__ import annotations

import os
import re
import warnings

import torch

import torch_npu
from torch_npu import _C
from pytest_npugraph.runtime.errors import ErrCode, pta_error

from . import memory, npu_config, streams, utils
from .memory import (MemPool, NPUPluggableAllocator, change_current_allocator, use_mem_pool, host_memory_stats,
                     host_memory_stats_as_nested_dict, reset_accumulated_host_memory_stats,
                     reset_peak_host_memory_stats)
from ._npugraph_handlers import NpuGraphOpHandler, register_npu_graph_handler
from .memory import (caching_allocator_alloc, caching_allocator_delete, empty_cache, empty_virt_addr_cache,
                     get_allocator_backend, get_per_process_memory_fraction, host_empty_cache, max_memory_allocated,
                     max_memory_cached, max_memory_reserved, mem_get_info, memory_allocated, memory_cached,
                     memory_reserved, memory_snapshot, memory_stats, memory_stats_as_nested_dict, memory_summary,
                     reset_accumulated_memory_stats, reset_max_memory_allocated, reset_max_memory_cached,
                     reset_peak_memory_stats, set_per_process_memory_fraction)
from .npu_config import (get_device_limit, get_stream_limit, is_jit_compile_false, reset_stream_limit,
                         set_compile_mode, set_device_limit, set_stream_limit)
from .streams import Event, ExternalEvent, ExternalStream, Stream, SyncLaunchStream
from .utils import (StreamContext, _get_device_index, current_device, current_stream, default_stream,
                    device, device_of, get_cann_version, set_device, set_stream, stream, synchronize)
from . import amp
from .random import (get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all, seed, seed_all,
                     set_rng_state, set_rng_state_all)
from ._tensor_types import (BFloat16Tensor, BoolTensor, ByteTensor, CharTensor, DoubleTensor, FloatTensor,
                            HalfTensor, IntTensor, LongTensor, ShortTensor)

__all__ = [
    "is_initialized", "init", "synchronize", "device_count", "can_device_access_peer", "set_device",
    "current_device", "get_device_name", "get_device_properties", "get_device_capability", "mem_get_info",
    "is_available", "device", "device_of", "utilization",
    "StreamContext", "stream", "set_stream", "current_stream", "default_stream", "Stream", "Event",
    "SyncLaunchStream", "ExternalEvent", "ExternalStream",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all",
    "caching_allocator_alloc", "caching_allocator_delete", "get_per_process_memory_fraction",
    "set_per_process_memory_fraction", "empty_cache", "memory_stats", "memory_stats_as_nested_dict",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_max_memory_cached", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_snapshot", "memory_summary",
    "get_allocator_backend", "host_empty_cache",
    "set_device_limit", "get_device_limit", "set_stream_limit", "reset_stream_limit", "get_stream_limit",
    "set_compile_mode", "is_jit_compile_false",
    "is_bf16_supported", "get_amp_supported_dtype", "is_autocast_enabled", "get_autocast_dtype",
    "set_autocast_enabled", "set_autocast_dtype",
    "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor", "IntTensor", "LongTensor",
    "ShortTensor", "BFloat16Tensor",
    "MemPool", "use_mem_pool", "NPUPluggableAllocator", "change_current_allocator", "host_memory_stats",
    "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats",
    "NpuGraphOpHandler", "register_npu_graph_handler", "get_soc_version", "set_option", "set_aoe",
    "set_mm_bmm_format_nd", "get_mm_bmm_format_nd", "get_npu_overflow_flag", "clear_npu_overflow_flag",
    "get_rng_state_all", "set_rng_state_all", "ipc_collect", "set_op_timeout_ms",
]

config = npu_config._npuConfig()
matmul = npu_config._allowHF32Matmul()
conv = npu_config._allowHF32Conv()


def _lazy_init() -> None:
    """Initialise the NPU state (per test in the emulator: every test starts uninitialised)."""
    _C._npu_init()


def init() -> None:
    _lazy_init()


def is_initialized() -> bool:
    return _C._npu_isInitialized()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C._npu_getDeviceCount()


def is_available() -> bool:
    return device_count() > 0


def _validated_index(device_name, message="Invalid device id") -> int:
    index = _get_device_index(device_name, optional=True)
    if index < 0 or index >= device_count():
        raise AssertionError(message + pta_error(ErrCode.VALUE))
    return index


def _profile():
    from pytest_npugraph.runtime.runtime import current

    return current().device().profile


def get_device_name(device_name=None) -> str:
    _validated_index(device_name)
    return _profile().name


class _CUuuid:
    def __init__(self, index: int):
        self.bytes = [0x4E, 0x50, 0x55, index] + [0] * 12

    def __str__(self) -> str:
        h = "".join(f"{b:02x}" for b in self.bytes)
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class _NPUDeviceProperties:
    """Read-only device properties (``torch_npu._C._NPUDeviceProperties``)."""

    major = minor = is_multi_gpu_board = is_integrated = None
    max_threads_per_multi_processor = warp_size = regs_per_multiprocessor = gcnArchName = None

    def __init__(self, profile, index):
        self.name = profile.name
        self.total_memory = profile.hbm_bytes
        self.cube_core_num = profile.cube_cores
        self.vector_core_num = profile.vector_cores
        self.L2_cache_size = profile.l2_cache_bytes
        self.multi_processor_count = profile.vector_cores or profile.cube_cores
        self.uuid = _CUuuid(index)

    def __repr__(self):
        mib = 1024.0 * 1024.0
        return (f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory / mib}MB, "
                f"cube_core_num={self.cube_core_num}, vector_core_num={self.vector_core_num}, uuid={self.uuid}, "
                f"L2_cache_size={self.L2_cache_size / mib}MB)")


def get_device_properties(device_name=None) -> _NPUDeviceProperties:
    index = _validated_index(device_name)
    _lazy_init()
    return _NPUDeviceProperties(_profile(), index)


def get_device_capability(device=None):
    """``None`` unless ``TORCH_NPU_DEVICE_CAPABILITY="major.minor"`` is set (warns either way)."""
    note = ("The return value of get_device_capability is only for compatibility with PyTorch and does not "
            "represent the actual capability of the NPU device.")
    env = os.getenv("TORCH_NPU_DEVICE_CAPABILITY")
    if not env:
        warnings.warn(f"You can set the device capability via the environment variable TORCH_NPU_DEVICE_CAPABILITY. "
                      f"{note}")
        return None
    match = re.match(r"^(\d+)\.(\d+)$", env)
    if not match:
        warnings.warn(f"torch.npu.get_device_capability can't parse TORCH_NPU_DEVICE_CAPABILITY environment "
                      f"variable: {env}. Expected format is 'major.minor' where major and minor are non-negative "
                      f"integers (e.g., '8.0').")
        return None
    warnings.warn(note)
    return int(match.group(1)), int(match.group(2))


def utilization(device=None) -> int:
    _validated_index(device)
    return 0


def can_device_access_peer(device, peer) -> bool:
    _validated_index(device)
    _validated_index(peer, "Invalid peer device id")
    return True


def is_bf16_supported(including_emulation: bool = False) -> bool:
    return True


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("npu")


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("npu", enabled)


def get_autocast_dtype():
    return torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype) -> None:
    torch.set_autocast_dtype("npu", dtype)


def set_sync_debug_mode(debug_mode) -> None:
    pass


def get_sync_debug_mode() -> int:
    return 0


def get_soc_version() -> int:
    """The c10_npu::SocVersion number of the current device's chip (220-225 for Ascend910B, 250-255 for A3)."""
    _lazy_init()
    return _C._npu_get_soc_version()


def set_option(option) -> None:
    """Runtime switches (``torch_npu._C._npu_setOption``): kept per test, no effect on CPU math."""
    if not isinstance(option, dict):
        raise TypeError("npu option must be a dict." + pta_error(ErrCode.PARAM))
    _C._npu_setOption(option)


def set_aoe(dump_path) -> None:
    """AOE tuning dumps graphs for offline tuning; nothing is tuned under emulation."""
    if not isinstance(dump_path, str) or not dump_path:
        raise RuntimeError("dump_path must be a non-empty str." + pta_error(ErrCode.PARAM))
    _C._npu_setOption({"autotune": "enable", "autotunegraphdumppath": dump_path})


def set_mm_bmm_format_nd(is_nd=True) -> None:
    _C._npu_setOption({"MM_BMM_ND_ENABLE": "enable" if is_nd else "disable"})


def get_mm_bmm_format_nd() -> bool:
    from .npu_config import _options

    return _options().get("MM_BMM_ND_ENABLE", "enable") == "enable"


def get_npu_overflow_flag() -> bool:
    """The float-overflow status register: CPU math does not saturate, so never set."""
    return False


def clear_npu_overflow_flag() -> None:
    pass


def ipc_collect() -> None:
    """Frees IPC memory no process uses any more; shared copies are freed with their tensors here."""


def set_op_timeout_ms(timeout_ms) -> None:
    if not isinstance(timeout_ms, int) or timeout_ms < 0:
        raise ValueError("timeout_ms must be a non-negative int." + pta_error(ErrCode.VALUE))
    _C._npu_setOption({"OP_TIMEOUT_MS": str(timeout_ms)})


def is_current_stream_capturing() -> bool:
    from pytest_npugraph.runtime.runtime import peek

    rt = peek()
    return bool(rt is not None and rt.current_stream().capture is not None)


def __getattr__(name):
    """Graph APIs live in the graphs module, imported on first use."""
    if name in ("NPUGraph", "graph", "graph_pool_handle", "make_graphed_callables",
                "super_kernel_scope_begin", "super_kernel_scope_end", "graph_task_group_begin",
                "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end"):
        from . import graphs

        return getattr(graphs, name)
    if name == "default_generators":
        from . import random

        return random.default_generators()
    if name == "npugraph_ex":
        import importlib

        return importlib.import_module(__name__ + ".npugraph_ex")
    from .._accelerator import inductor_entry

    entry = inductor_entry(name)    # inductor's PrivateUse1 registration asks for these three names
    if entry is not None:
        return entry
    raise AttributeError(f"module 'torch_npu.npu' has no attribute '{name}'")
