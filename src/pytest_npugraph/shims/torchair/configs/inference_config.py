"""``CompilerConfig.inference_config`` (dynamic gears)."""
from torchair.configs._option_base import NpuBaseConfig, OptionValue

__all__ = []


class _InferenceConfig(NpuBaseConfig):
    def __init__(self):
        self.dynamic_gears_merge_policy = OptionValue("zip", ["zip", "product"])
        super().__init__()
