"""``CompilerConfig.dump_config``: data dump switches (the dump itself: ``pytest_npugraph.compiler.data_dump``)."""
from __future__ import annotations

import os
from typing import Optional

from torchair.configs._option_base import MustExistedFileAddr, MustExistedPathValue, NpuBaseConfig, OptionValue, RegexValue

__all__ = []


class _DataDumpConfig(NpuBaseConfig):
    def __init__(self):
        self.enable_dump = OptionValue(False, [False, True])
        self.dump_path = MustExistedPathValue("./")
        self.dump_mode = OptionValue("all", ["input", "output", "all"])
        self.quant_dumpable = OptionValue(False, [False, True])
        self.dump_step = RegexValue("", r"^(((\d+)|(\d+-{0,1}\d+))\|{0,1})*$", "0|1|2-5|6")
        self.dump_layer = RegexValue("", r'^[0-9a-zA-Z_" "/\\.]*$', "Mul_1 Add1 Conv2D_1")
        self.dump_data = OptionValue("tensor", ["tensor", "stats"])
        self.dump_config_path = MustExistedFileAddr(None)
        self.data_dump_stage = OptionValue("optimized", ["original", "optimized"])
        super().__init__()

    def full_path(self):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            sub = f"worldsize{dist.get_world_size()}_global_rank{dist.get_rank()}"
        else:
            sub = "worldsize1_global_rank0"
        path = os.path.join(self.dump_path.value, sub)
        os.makedirs(path, exist_ok=True)
        return path

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        options = {}
        if self.dump_config_path.value is not None:
            options["ge_dump_with_acl_config"] = self.dump_config_path.value
        if self.enable_dump and mode in ("reduce-overhead", "npugraph_ex"):
            options.update({"aclgraph.enableDump": "1", "aclgraph.dumpPath": self.full_path(),
                            "aclgraph.dumpStage": self.data_dump_stage.value})
        elif self.enable_dump:
            options.update({"ge.exec.enableDump": "1", "ge.exec.dumpPath": self.full_path(),
                            "ge.exec.dumpMode": self.dump_mode.value, "ge.exec.dumpData": self.dump_data.value})
        return {}, options
