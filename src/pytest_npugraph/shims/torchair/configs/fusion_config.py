"""``CompilerConfig.fusion_config`` (GE fusion switch file)."""
from torchair.configs._option_base import FileValue, NpuBaseConfig

__all__ = []


class _FusionConfig(NpuBaseConfig):
    def __init__(self):
        self.fusion_switch_file = FileValue(None)
        super().__init__()
