"""The npugraph_ex ``options={...}`` accepted by ``torch.compile(..., backend=torchair backend)`` and how
each maps onto a ``CompilerConfig`` field (as torchair does, each value is also written onto the
class ``_NpuGraphExConfig``: global state)."""
from __future__ import annotations

from typing import Callable

__all__ = []


def _invert_bool(x):
    if isinstance(x, bool):
        return not x
    if isinstance(x, int) and x in (0, 1):
        return 1 - x
    return x


class _NpuGraphExConfig:
    force_eager: bool = False
    use_graph_pool = None
    reuse_graph_pool_in_same_fx: bool = True
    capture_limit: int = 64
    clone_input: bool = True
    clone_output: bool = False
    static_kernel_compile: bool = False
    super_kernel_optimize: bool = False
    super_kernel_optimize_options: dict = None
    super_kernel_debug_options: dict = None
    frozen_parameter: bool = False
    remove_noop_ops: bool = True
    remove_cat_ops: bool = True
    inplace_pass: bool = True
    input_inplace_pass: bool = True
    pattern_fusion_pass: bool = True
    post_grad_custom_pre_pass: Callable = None
    post_grad_custom_post_pass: Callable = None
    dump_tensor_data: bool = False
    data_dump_stage: str = "optimized"
    data_dump_dir: str = "./"
    _vllm_aclnn_static_kernel_sym_index: int = 0
    _vllm_aclnn_static_kernel_sym_range: list = None

    OPTIONS_TO_CONFIG_MAP = {
        "_vllm_aclnn_static_kernel_sym_index": "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index",
        "_vllm_aclnn_static_kernel_sym_range": "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range",
        "static_kernel_compile": "experimental_config.aclgraph._aclnn_static_shape_kernel",
        "super_kernel_optimize": "experimental_config.aclgraph._super_kernel_optimize",
        "super_kernel_optimize_options": "experimental_config.aclgraph._super_kernel_optimize_options",
        "super_kernel_debug_options": "experimental_config.aclgraph._super_kernel_debug_options",
        "inplace_pass": "debug.aclgraph.disable_reinplace_inplaceable_ops_pass",
        "input_inplace_pass": "debug.aclgraph.disable_reinplace_input_mutated_ops_pass",
        "remove_noop_ops": "experimental_config.remove_noop_ops",
        "remove_cat_ops": "debug.aclgraph.remove_cat_ops",
        "force_eager": "debug.run_eagerly",
        "pattern_fusion_pass": "experimental_config.pattern_fusion_pass",
        "clone_input": "debug.aclgraph.clone_input",
        "frozen_parameter": "experimental_config.frozen_parameter",
        "post_grad_custom_pre_pass": "post_grad_custom_pre_pass",
        "post_grad_custom_post_pass": "post_grad_custom_post_pass",
        "use_graph_pool": "aclgraph_config.use_custom_pool",
        "reuse_graph_pool_in_same_fx": "debug.aclgraph.disable_mempool_reuse_in_same_fx",
        "capture_limit": "debug.aclgraph.static_capture_size_limit",
        "clone_output": "debug.aclgraph.enable_output_clone",
        "dump_tensor_data": "dump_config.enable_dump",
        "data_dump_stage": "dump_config.data_dump_stage",
        "data_dump_dir": "dump_config.dump_path",
    }
    OPTIONS_TO_CONFIG_TRANSFORMATIONS = {"inplace_pass": _invert_bool, "input_inplace_pass": _invert_bool,
                                         "reuse_graph_pool_in_same_fx": _invert_bool}
    ALLOWED_OPTIONS = set(OPTIONS_TO_CONFIG_MAP)

    @classmethod
    def as_dict(cls):
        return {k: v for k, v in vars(cls).items() if k in cls.OPTIONS_TO_CONFIG_MAP}


def _process_kwargs_options(config, kwargs):
    """Apply ``options={...}`` (from ``torch.compile(..., options=...)``) to ``config``."""
    for option, value in kwargs.get("options", {}).items():
        if option not in _NpuGraphExConfig.ALLOWED_OPTIONS:
            raise ValueError(f"Invalid option '{option}', allowed options: {sorted(_NpuGraphExConfig.ALLOWED_OPTIONS)}")
        setattr(_NpuGraphExConfig, option, value)
        transform = _NpuGraphExConfig.OPTIONS_TO_CONFIG_TRANSFORMATIONS.get(option)
        value = transform(value) if transform else value
        *parents, leaf = _NpuGraphExConfig.OPTIONS_TO_CONFIG_MAP[option].split(".")
        target = config
        for part in parents:
            target = getattr(target, part)
        setattr(target, leaf, value)
