"""``CompilerConfig.ge_config``: GE session options; ``aicore_num`` ("A|V") is the GE-mode global
core limit."""
from __future__ import annotations

from torchair.configs._option_base import NpuBaseConfig, OptionValue

__all__ = []


class _GEConfig(NpuBaseConfig):
    def __init__(self):
        self.enable_single_stream = OptionValue(False, [True, False])
        self.oo_level = OptionValue("O3", ["O1", "O3"])
        self.oo_constant_folding = OptionValue(None, [True, False])
        self.oo_dead_code_elimination = OptionValue(None, [True, False])
        self.export_compile_stat = OptionValue("2", ["0", "1", "2"])
        self.aicore_num = OptionValue(None, None)
        self.optimization_switch = OptionValue(None, None)
        self.multistream_parallel_mode = OptionValue(None, None)
        super().__init__()
