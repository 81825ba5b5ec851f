"""``CompilerConfig``: the torchair compile options (mirrors ``configs/compiler_config.py``), with the
real field names, defaults, checks and the support warnings ``get_npu_backend`` emits."""
from __future__ import annotations

import warnings
from typing import Any

from torchair.configs._option_base import CallableValue, NpuBaseConfig, OptionValue
from torchair.configs.aclgraph_config import _AclGraphConfig
from torchair.configs.aoe_config import _AoeConfig
from torchair.configs.debug_config import _DebugConfig
from torchair.configs.dump_config import _DataDumpConfig
from torchair.configs.experimental_config import _ExperimentalConfig
from torchair.configs.export_config import _ExportConfig
from torchair.configs.fusion_config import _FusionConfig
from torchair.configs.ge_config import _GEConfig
from torchair.configs.inference_config import _InferenceConfig
from torchair.configs.npugraphex_config import _NpuGraphExConfig

__all__ = ["CompilerConfig"]


class CompilerConfig(NpuBaseConfig):
    """Set CompilerConfig configuration"""

    def __init__(self):
        self.debug = _DebugConfig()
        self.aoe_config = _AoeConfig()
        self.export = _ExportConfig()
        self.dump_config = _DataDumpConfig()
        self.fusion_config = _FusionConfig()
        self.experimental_config = _ExperimentalConfig()
        self.inference_config = _InferenceConfig()
        self.ge_config = _GEConfig()
        self.aclgraph_config = _AclGraphConfig()
        self.npugraphex_config = _NpuGraphExConfig()
        self.mode = OptionValue("max-autotune", ["max-autotune", "reduce-overhead", "npugraph_ex"])
        self.post_grad_custom_pre_pass = CallableValue(None)
        self.post_grad_custom_post_pass = CallableValue(None)
        super().__init__()
        # as torchair: listed twice in the "all options" of an unknown-option error
        self._fixed_attrs.append("post_grad_custom_pre_pass")
        self._fixed_attrs.append("post_grad_custom_post_pass")

    def __eq__(self, other):
        if not isinstance(other, CompilerConfig):
            return False
        return dict(_get_all_leaf_properties(self)) == dict(_get_all_leaf_properties(other))


    def as_dict(self):  # pylint: disable=arguments-differ
        local, glob = super().as_dict(self.mode.value)
        local.pop("post_grad_custom_pre_pass", None)
        local.pop("post_grad_custom_post_pass", None)
        return local, glob


# options that only take effect in one family of modes (key, values that trigger the warning; [] = any)
unsupport_geconfig_list = [
    ("debug.aclgraph.disable_reinplace_input_mutated_ops_pass", [True]),
    ("experimental_config.aclgraph._aclnn_static_shape_kernel", [True]),
    ("experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir", []),
    ("debug.aclgraph.clone_input", [False]),
    ("debug.aclgraph.disable_reinplace_inplaceable_ops_pass", [True]),
]
unsupport_aclgraphconfig_list = [
    ("inference_config.dynamic_gears_merge_policy", ["product"]),
    ("debug.fx_summary.type", ["csv"]),
    ("dump_config.enable_dump", [True]),
    ("ge_config.export_compile_stat", ["1", "0"]),
    ("export.experimental.auto_atc_config_generated", [True]),
    ("export.experimental.enable_record_nn_module_stack", [True]),
    ("ge_config.enable_single_stream", [True]),
    ("ge_config.oo_level", ["O1"]),
    ("ge_config.oo_constant_folding", [True, False]),
    ("ge_config.oo_dead_code_elimination", [True, False]),
    ("experimental_config.topology_sorting_strategy", ["BFS", "RDFS", "StableRDFS"]),
    ("experimental_config.cc_parallel_enable", [True]),
    ("experimental_config.enable_ref_data", [True]),
    ("experimental_config.tiling_schedule_optimize", [True]),
    ("experimental_config.enable_view_optimize", [False, True]),
    ("fusion_config.fusion_switch_file", []),
    ("experimental_config.static_model_ops_lower_limit", []),
    ("ge_config.aicore_num", []),
    ("ge_config.optimization_switch", []),
    ("ge_config.multistream_parallel_mode", []),
]


def _check_config_support(config: Any):
    """Warn about options that do not take effect in the chosen mode (as ``get_npu_backend`` does)."""
    if not hasattr(config, "mode"):      # torchair reads config.mode unchecked: its AttributeError, raised here
        raise AttributeError(f"'{type(config).__name__}' object has no attribute 'mode'")
    warnings.filterwarnings("once", category=UserWarning)
    leaves = dict(_get_all_leaf_properties(config))
    mode = config.mode.value
    checks = unsupport_geconfig_list if mode == "max-autotune" else unsupport_aclgraphconfig_list
    flagged = []
    for key, triggers in checks:
        value = leaves.get(key) or leaves.get(key + "._value")
        if value is not None and (not triggers or value in triggers):
            flagged.append(f"config.{key}:{value}")
    if flagged and mode in ("max-autotune", "reduce-overhead"):
        extra = "" if mode == "max-autotune" else ", set_dim_gears, dynamo_export, scope, npu_print"
        warnings.warn(f"The following torchair config or properties may not take effect or report error in {mode} "
                      f"mode: {', '.join(flagged)}{extra}", UserWarning)
    if mode == "reduce-overhead":
        warnings.filterwarnings("once", category=DeprecationWarning)
        warnings.warn("The \"reduce-overhead\" mode configuration will be deprecated. Please use the "
                      "\"npugraph_ex\" backend.", DeprecationWarning)


def _get_all_leaf_properties(obj: Any, prefix: str = ""):
    """(dotted path, raw value) of every leaf option under ``obj`` (an option's ``_value`` is a leaf
    named ``<path>._value``)."""
    stack, leaves = [(prefix, obj)], []
    while stack:
        path, current = stack.pop()
        try:
            attrs = dict(vars(current))
        except TypeError:
            leaves.append((path.rstrip("."), current))
            continue
        if not attrs:
            leaves.append((path.rstrip("."), current))
            continue
        for key, value in attrs.items():
            try:
                has_children = bool(vars(value))
            except TypeError:
                has_children = False
            if has_children:
                stack.append((f"{path}{key}.", value))
            elif value is not None:
                leaves.append((f"{path}{key}", value.value if hasattr(value, "value") else value))
    return leaves
