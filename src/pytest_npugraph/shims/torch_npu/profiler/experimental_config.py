"""``torch_npu.profiler._ExperimentalConfig`` and its level / metric / export constants (torch_npu's values)."""
from typing import Optional, Union

from .scheduler import _warn

__all__ = ["_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics", "supported_export_type",
           "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem"]


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Db = "db"
    Text = "text"


class HostSystem:
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"


def supported_profiler_level() -> set:
    return {ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2, ProfilerLevel.Level_none}


def supported_ai_core_metrics() -> set:
    return {v for k, v in vars(AiCMetrics).items() if not k.startswith("_")}


def supported_export_type() -> set:
    return {ExportType.Db, ExportType.Text}


class _ExperimentalConfig:
    """The profiler's experimental switches; invalid values are reset with a warning, as torch_npu does."""

    def __init__(self, profiler_level: str = ProfilerLevel.Level0, aic_metrics: str = AiCMetrics.PipeUtilization,
                 l2_cache: bool = False, msprof_tx: bool = False, mstx: bool = False, data_simplification: bool = True,
                 record_op_args: bool = False, op_attr: bool = False, gc_detect_threshold: Optional[float] = None,
                 export_type: Union[str, list] = ExportType.Text, host_sys: Optional[list] = None,
                 mstx_domain_include: Optional[list] = None, mstx_domain_exclude: Optional[list] = None,
                 sys_io: bool = False, sys_interconnection: bool = False):
        self._profiler_level = profiler_level
        self._aic_metrics = aic_metrics
        self._l2_cache = l2_cache
        self._msprof_tx = msprof_tx
        self._mstx = mstx
        self._data_simplification = data_simplification
        self.record_op_args = record_op_args
        self._export_type = self._conver_export_type_to_list(export_type)
        self._host_sys = host_sys or []
        self._op_attr = op_attr
        self._gc_detect_threshold = gc_detect_threshold
        self._mstx_domain_include = mstx_domain_include or []
        self._mstx_domain_exclude = mstx_domain_exclude or []
        self._sys_io = sys_io
        self._sys_interconnection = sys_interconnection
        self._check_params()

    @property
    def export_type(self):
        return self._export_type

    @property
    def with_gc(self):
        return self._gc_detect_threshold is not None

    @property
    def gc_detect_threshold(self):
        return self._gc_detect_threshold

    @property
    def tx_enabled(self):
        return self._msprof_tx or self._mstx

    def _conver_export_type_to_list(self, export_type) -> list:
        if isinstance(export_type, str):
            return [export_type]
        if isinstance(export_type, list):
            return list(dict.fromkeys(export_type))
        return [ExportType.Text]

    def _check_params(self):
        if self._profiler_level not in supported_profiler_level():
            _warn("Invalid parameter profiler_level, reset it to ProfilerLevel.Level0.")
            self._profiler_level = ProfilerLevel.Level0
        if self._aic_metrics not in supported_ai_core_metrics():
            _warn("Invalid parameter aic_metrics, reset it to default.")
            self._aic_metrics = AiCMetrics.PipeUtilization
        for name in ("_l2_cache", "_msprof_tx", "_mstx", "_data_simplification", "record_op_args", "_op_attr",
                     "_sys_io", "_sys_interconnection"):
            if not isinstance(getattr(self, name), bool):
                _warn(f"Invalid parameter {name.lstrip('_')}, which must be a boolean, reset it to default.")
                setattr(self, name, name == "_data_simplification")
        if not self._export_type or any(t not in supported_export_type() for t in self._export_type):
            _warn("Invalid parameter export_type, reset it to text.")
            self._export_type = [ExportType.Text]
        if self._gc_detect_threshold is not None and (
                not isinstance(self._gc_detect_threshold, (int, float)) or self._gc_detect_threshold < 0):
            _warn("Invalid parameter gc_detect_threshold, reset it to None.")
            self._gc_detect_threshold = None
