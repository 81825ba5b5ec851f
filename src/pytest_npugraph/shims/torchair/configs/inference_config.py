"""``CompilerConfig.inference_config`` (dynamic gears)."""
from typing import Optional

from torchair.configs._option_base import NpuBaseConfig, OptionValue

__all__ = []


class _InferenceConfig(NpuBaseConfig):
    def __init__(self):
        self.dynamic_gears_merge_policy = OptionValue("zip", ["zip", "product"])
        super().__init__()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        """The merge policy is read where gears are made, not handed to GE as an option."""
        return {}, {}
