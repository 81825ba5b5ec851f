"""``CompilerConfig.fusion_config`` (GE fusion switch file)."""
from typing import Optional

from torchair.configs._option_base import FileValue, NpuBaseConfig

__all__ = []


class _FusionConfig(NpuBaseConfig):
    def __init__(self):
        self.fusion_switch_file = FileValue(None)
        super().__init__()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        if self.fusion_switch_file.value is None:
            return {}, {}
        return {}, {"ge.fusionSwitchFile": self.fusion_switch_file.value}
