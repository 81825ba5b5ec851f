"""``CompilerConfig.experimental_config`` (and its ``aclgraph`` part: static kernels, SuperKernel)."""
from __future__ import annotations

from typing import Optional

from torchair.configs._option_base import (DictOptionValue, IntListValue, IntRangeValue, NpuBaseConfig, OptionValue,
                                           StrOptionValue)

__all__ = []
INT64_MAX = 2**63 - 1


class _ExperimentalConfig(NpuBaseConfig):
    def __init__(self):
        self.cc_parallel_enable = OptionValue(False, [False, True])
        self.keep_inference_input_mutations = OptionValue(True, [True, False])
        self.memory_efficiency = OptionValue(False, [True, False])
        self.frozen_parameter = OptionValue(False, [True, False])
        self.static_model_ops_lower_limit = IntRangeValue(None, -1, INT64_MAX)
        self.jit_compile = OptionValue("auto", ["auto"])
        self.npu_fx_pass = OptionValue(False, [True, False])
        self.aot_config_enable_joint_graph = OptionValue(False, [True, False])
        self.aot_config_output_loss_index = OptionValue(0, None)
        self.topology_sorting_strategy = OptionValue("DFS", ["BFS", "DFS", "RDFS", "StableRDFS"])
        self.enable_ref_data = OptionValue(False, [True, False])
        self.enable_view_optimize = OptionValue(True, [True, False])
        self.remove_noop_ops = OptionValue(True, [True, False])
        self.tiling_schedule_optimize = OptionValue(False, [True, False])
        self.pattern_fusion_pass = OptionValue(True, [True, False])
        self.aclgraph = _AclGraphExperimentalConfig()
        super().__init__()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        local = {name: getattr(self, name).value for name in ("remove_noop_ops", "pattern_fusion_pass",
                                                               "frozen_parameter")}
        if mode == "max-autotune":
            local["ge.tiling_schedule_optimize"] = "1" if self.tiling_schedule_optimize else "0"
            local["ge.featureBaseRefreshable"] = "1" if self.memory_efficiency else "0"
            local["ge.topoSortingMode"] = {"BFS": "0", "DFS": "1", "RDFS": "2", "StableRDFS": "3"}[
                self.topology_sorting_strategy.value]
            if self.jit_compile.value == "auto":
                local["ge.jit_compile"] = "2"
            if self.static_model_ops_lower_limit.value is not None:
                local["ge.exec.static_model_ops_lower_limit"] = str(self.static_model_ops_lower_limit.value)
            return local, {"ge.exec.enableEngineParallel": "1" if self.cc_parallel_enable else "0"}
        aclgraph_local, aclgraph_global = self.aclgraph.as_dict(mode)
        local.update(aclgraph_local)
        return local, aclgraph_global


class _AclGraphExperimentalConfig(NpuBaseConfig):
    def __init__(self):
        self._aclnn_static_shape_kernel = OptionValue(False, [True, False])
        self._aclnn_static_shape_kernel_build_dir = StrOptionValue()
        self._aclnn_static_shape_kernel_sym_value_range = IntListValue(None)
        self._aclnn_static_shape_kernel_sym_index = IntRangeValue(0, 0, INT64_MAX)
        self._super_kernel_optimize = OptionValue(False, [True, False])
        self._super_kernel_optimize_options = DictOptionValue(None)
        self._super_kernel_debug_options = DictOptionValue(None)
        super().__init__()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        local = {}
        if mode == "max-autotune":
            return local, {}
        if self._aclnn_static_shape_kernel.value == "1":
            local["_aclnn_static_shape_kernel"] = "1"
            local["_aclnn_static_shape_kernel_build_dir"] = self._aclnn_static_shape_kernel_build_dir.value or ""
            local["_aclnn_static_shape_kernel_sym_value_range"] = self._aclnn_static_shape_kernel_sym_value_range.value
            local["_aclnn_static_shape_kernel_sym_index"] = self._aclnn_static_shape_kernel_sym_index.value
        if self._super_kernel_optimize.value == "1":
            local["_super_kernel_optimize"] = "1"
            for name in ("_super_kernel_optimize_options", "_super_kernel_debug_options"):
                if getattr(self, name).value is not None:
                    local[name] = getattr(self, name).value
        return local, {}
