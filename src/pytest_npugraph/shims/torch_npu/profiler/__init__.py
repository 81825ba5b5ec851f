"""Emulated ``torch_npu.profiler``: the Ascend PyTorch Profiler's API as a working context manager.

``profile`` runs the code it wraps, walks its ``schedule`` step by step (``step()``), records each
step's window in the emulated trace, and calls ``on_trace_ready`` when a RECORD_AND_SAVE step ends,
as the real profiler does.  ``tensorboard_trace_handler(dir)`` writes the running test's emulated
device timeline as Chrome-trace JSON under ``dir/<worker>_<pid>_<ms>_ascend_pt/ASCEND_PROFILER_OUTPUT/
trace_view.json`` (the real tool's file name); there are no msprof/CANN data files.
"""
from .profiler import profile, _KinetoProfile, tensorboard_trace_handler, analyse  # noqa: F401
from .profiler_interface import supported_activities, ProfilerActivity  # noqa: F401
from .scheduler import Schedule as schedule, ProfilerAction  # noqa: F401
from .experimental_config import (_ExperimentalConfig, supported_profiler_level, supported_ai_core_metrics,  # noqa: F401
                                  supported_export_type, ProfilerLevel, AiCMetrics, ExportType, HostSystem)
from . import dynamic_profile  # noqa: F401

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler", "schedule",
           "ProfilerAction", "_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem"]
