"""``CompilerConfig.ge_config``: GE session options; ``aicore_num`` ("A|V") is the GE-mode global
core limit."""
from __future__ import annotations

from typing import Optional

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

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        """GE's session (global) options and graph (local) options these fields set."""
        glob, local = {}, {}
        if self.aicore_num.value is not None:
            glob["ge.aicoreNum"] = self.aicore_num.value
        glob["ge.enableSingleStream"] = "true" if self.enable_single_stream else "false"
        glob["ge.oo.level"] = self.oo_level.value
        for name, key in (("oo_constant_folding", "ge.oo.constantFolding"),
                          ("oo_dead_code_elimination", "ge.oo.deadCodeElimination")):
            if getattr(self, name).value is not None:
                glob[key] = "true" if getattr(self, name) else "false"
        if self.oo_level.value == "O1":
            local["ge.topoSortingMode"] = "3"          # StableRDFS
        glob["ge.exportCompileStat"] = self.export_compile_stat.value
        if self.optimization_switch.value is not None:
            glob["ge.optimizationSwitch"] = self.optimization_switch.value
        if self.multistream_parallel_mode.value is not None:
            local["ge.autoMultistreamParallelMode"] = self.multistream_parallel_mode.value
        return local, glob
