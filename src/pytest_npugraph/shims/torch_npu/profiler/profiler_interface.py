"""``torch_npu._C._profiler.ProfilerActivity`` and ``supported_activities``."""
import enum

__all__ = ["supported_activities"]


class ProfilerActivity(enum.Enum):
    """What the profiler collects: host-side (CPU) and device-side (NPU) activity."""
    CPU = 0
    NPU = 1


def supported_activities() -> set:
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}
