"""pytest-npugraph: an emulated Ascend NPU for CPU test runs, and checks for multi-stream hazards.

Importing this package imports neither torch nor networkx.
"""
from .errors import NotEmulated
from .hazard import KINDS, Hazard, NpuHazardWarning

__all__ = ["Hazard", "KINDS", "NotEmulated", "NpuHazardWarning"]
__version__ = "0.1.0"
