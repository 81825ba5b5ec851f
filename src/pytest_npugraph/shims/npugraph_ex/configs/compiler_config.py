"""npugraph_ex's flat ``CompilerConfig`` (mirrors ``configs/compiler_config.py``): the option names,
defaults, value checks and the ``options={...}`` error of ``torch.compile(..., backend="npugraph_ex")``."""
from __future__ import annotations

__all__ = ["CompilerConfig"]

from npugraph_ex.configs._option_base import (CallableValue, DictOptionValue, IntListValue, IntRangeValue,
                                              MustExistedPathValue, NpuBaseConfig, OptionValue)

INT64_MAX = 2**63 - 1
_BOOL = [True, False]


class CompilerConfig(NpuBaseConfig):
    """Set CompilerConfig configuration"""

    def __init__(self):
        self.force_eager = OptionValue(False, _BOOL)
        self.use_graph_pool = None
        self.reuse_graph_pool_in_same_fx = OptionValue(True, _BOOL)
        self.capture_limit = IntRangeValue(64, 1, INT64_MAX)
        self.clone_input = OptionValue(True, _BOOL)
        self.clone_output = OptionValue(False, _BOOL)
        self.disable_static_kernel_compile_cache = OptionValue(False, _BOOL)
        self.static_kernel_compile = OptionValue(False, _BOOL)
        self.frozen_parameter = OptionValue(False, _BOOL)
        self.remove_noop_ops = OptionValue(True, _BOOL)
        self.remove_cat_ops = OptionValue(True, _BOOL)
        self.inplace_pass = OptionValue(True, _BOOL)
        self.input_inplace_pass = OptionValue(True, _BOOL)
        self.pattern_fusion_pass = OptionValue(True, _BOOL)
        self.post_grad_custom_pre_pass = CallableValue(None)
        self.post_grad_custom_post_pass = CallableValue(None)
        self.dump_tensor_data = OptionValue(False, _BOOL)
        self.data_dump_stage = OptionValue('optimized', ['original', 'optimized'])
        self.data_dump_dir = MustExistedPathValue("./")
        self._vllm_aclnn_static_kernel_sym_index = IntRangeValue(0, 0, INT64_MAX)
        self._vllm_aclnn_static_kernel_sym_range = IntListValue(None)
        self.super_kernel_optimize = OptionValue(False, _BOOL)
        self.super_kernel_optimize_options = DictOptionValue(None)
        self.super_kernel_debug_options = DictOptionValue(None)
        self.deadlock_check = OptionValue(False, _BOOL)
        self.capture_error_mode = OptionValue("global", ["global", "thread_local", "relaxed"])
        self.mode = OptionValue("npugraph_ex", ["npugraph_ex"])
        self.force_recapture = OptionValue(False, _BOOL)
        self.unsafe_skip_npugraph_capture_validation = OptionValue(False, _BOOL)
        self.record_statistics_debug_info = OptionValue(False, _BOOL)
        super().__init__()
        self._fixed_attrs.append("post_grad_custom_pre_pass")
        self._fixed_attrs.append("post_grad_custom_post_pass")
        self._fixed_attrs.append("use_graph_pool")


def _process_kwargs_options(config, kwargs):
    """Apply ``options={...}``: an unknown name is a ``ValueError`` listing the supported attributes."""
    if "options" not in kwargs:
        return
    options = kwargs["options"]
    for option in options:
        if not hasattr(config, option):
            supported = [attr for attr in dir(config) if not attr.startswith('__') and not callable(getattr(config, attr))]
            supported.remove("_fixed_attrs")
            raise ValueError(f"Invalid option '{option}'. The '{config.__class__.__name__}' object does not have "
                             f"attribute '{option}'. Supported attributes are: {supported}")
        setattr(config, option, options[option])
