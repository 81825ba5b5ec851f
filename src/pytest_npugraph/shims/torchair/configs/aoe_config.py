"""``CompilerConfig.aoe_config`` (AOE tuning; accepted and ignored by the emulator)."""
from typing import Optional

from torchair.configs._option_base import FileValue, MustExistedPathValue, NpuBaseConfig, OptionValue

__all__ = []


class _AoeConfig(NpuBaseConfig):
    def __init__(self):
        self.aoe_mode = OptionValue(None, ["2"])
        self.work_path = MustExistedPathValue("./")
        self.aoe_config_file = FileValue(None)
        super().__init__()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        """Nothing unless AOE tuning is asked for."""
        if self.aoe_mode.value is None:
            return {}, {}
        return super().as_dict(mode)
