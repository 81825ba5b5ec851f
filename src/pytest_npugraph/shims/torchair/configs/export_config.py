"""``CompilerConfig.export`` (``dynamo_export``; accepted, export itself is not emulated)."""
from typing import Optional

from torchair.configs._option_base import MustExistedPathValue, NpuBaseConfig, OptionValue

__all__ = []


class _ExperimentalConfig(NpuBaseConfig):
    def __init__(self):
        self.enable_record_nn_module_stack = OptionValue(False, [True, False])
        self.auto_atc_config_generated = OptionValue(False, [True, False])
        self.enable_lite_export = OptionValue(False, [True, False])
        super().__init__()


class _ExportConfig(NpuBaseConfig):
    def __init__(self):  # pylint: disable=super-init-not-called  (as torchair: no option check here)
        self.export_mode = OptionValue(False, [False, True])
        self.export_path_dir = MustExistedPathValue("./")
        self.export_name = None
        self.weight_name = None
        self.inputs_name = None
        self.experimental = _ExperimentalConfig()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        if not self.export_mode:
            return {}, {}
        return {"export_path_dir": self.export_path_dir, "export_name": self.export_name}, {}
