"""What the compiler reads of a configuration: one frozen ``Settings`` per backend, built when the
backend is created (``torchair.get_npu_backend(compiler_config=...)``, ``options={...}``, or the
``npugraph_ex`` backend).  The compiler never reads or writes the user's config object after that:
values TorchAir derives while compiling (a custom pool turns off pool reuse, a core limit turns off
static kernels before CANN 9) are derived here or held in the compiled graph.

``settings_from_config`` reads a torchair ``CompilerConfig`` (nested) or an npugraph_ex one (flat) by
attribute, so the compiler imports neither package."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

ACLGRAPH_MODES = ("reduce-overhead", "npugraph_ex")


@dataclass(frozen=True)
class Settings:
    mode: str = "max-autotune"                 # "max-autotune" | "reduce-overhead" | "npugraph_ex"
    backend: str = "torchair"                  # "torchair" (get_npu_backend) | "npugraph_ex" (the backend)
    # common FX passes
    pre_pass: Optional[Callable] = None
    post_pass: Optional[Callable] = None
    remove_noop_ops: bool = True
    pattern_fusion: bool = True                # experimental_config.pattern_fusion_pass (fusion.py)
    keep_inference_input_mutations: bool = False
    config: Any = field(default=None, compare=False, repr=False)   # handed to the custom passes, read-only
    graph_dump: Optional[Callable[[str], str]] = None            # stem -> path, None: no dump
    graph_dump_type: Optional[str] = None
    run_eagerly: bool = False
    # data dump (data_dump.py): the base folder (None: off), aclgraph's stage, GE's filters
    data_dump_path: Optional[str] = None
    data_dump_stage: str = "optimized"
    dump_mode: str = "all"
    dump_step: str = ""
    dump_layer: str = ""
    # the FX optimisation step (pipeline.optimize_fx), or a callable (gm, settings, example_inputs) -> gm that
    # replaces it: torchair's npu_fx_compiler._optimize_fx, looked up at each compile (tests wrap it)
    optimize: Optional[Callable] = field(default=None, compare=False)
    # dynamo_export: (export_path_dir, export_name, {id(weight): name}); None: run the graph
    export: Optional[tuple] = field(default=None, compare=False)
    # aclgraph
    custom_pool: Any = None
    reuse_pool_in_fx: bool = True
    clone_input: bool = True
    clone_output: bool = False
    capture_limit: int = 64
    frozen_parameter: bool = False
    disable_inplaceable_pass: bool = False
    disable_input_mutated_pass: bool = False
    static_kernel: bool = False
    super_kernel_optimize: bool = False
    super_kernel_optimize_options: Optional[dict] = None
    super_kernel_debug_options: Optional[dict] = None
    cann_ge_9: bool = False                    # CANN >= 9.0.0 (static kernels and core limits together)
    deadlock_check: bool = False
    force_recapture: bool = False
    capture_error_mode: str = "global"
    # GE
    aicore_num: Optional[str] = None
    ge_options: tuple = field(default=((), ()), compare=False)   # the config's (local, global) GE options

    @property
    def aclgraph(self) -> bool:
        return self.mode in ACLGRAPH_MODES

    @property
    def op_namespace(self) -> str:
        """The namespace of the scope/event ops the passes insert."""
        return "npugraph_ex" if self.backend == "npugraph_ex" else "air"

    def replace(self, **changes) -> "Settings":
        return replace(self, **changes)


def _raw(option):
    """An option's typed value (``OptionValue.value`` stringifies bools; ``_value`` does not)."""
    return getattr(option, "_value", option)


def _flag(option) -> bool:
    return bool(_raw(option))


def settings_from_config(config, *, backend: str = "torchair", cann_ge_9: bool = False) -> Settings:
    """The typed snapshot of a torchair ``CompilerConfig`` or an npugraph_ex ``CompilerConfig``."""
    if hasattr(config, "debug"):
        return _from_torchair(config, cann_ge_9)
    return _from_npugraph_ex(config, backend, cann_ge_9)


def _dump(dump) -> tuple:
    kind = _raw(dump.type)
    return (dump.full_path if kind is not None else None), kind


def _from_torchair(config, cann_ge_9: bool) -> Settings:
    debug, acl, experimental = config.debug, config.debug.aclgraph, config.experimental_config
    pool = config.aclgraph_config.use_custom_pool
    dump, dump_type = _dump(debug.graph_dump)
    return Settings(
        mode=_raw(config.mode), backend="torchair",
        pre_pass=_raw(config.post_grad_custom_pre_pass), post_pass=_raw(config.post_grad_custom_post_pass),
        remove_noop_ops=_flag(experimental.remove_noop_ops), pattern_fusion=_flag(experimental.pattern_fusion_pass),
        keep_inference_input_mutations=_flag(experimental.keep_inference_input_mutations),
        config=config, graph_dump=dump, graph_dump_type=dump_type, run_eagerly=_flag(debug.run_eagerly),
        custom_pool=pool,
        reuse_pool_in_fx=pool is None and not _flag(acl.disable_mempool_reuse_in_same_fx),
        clone_input=_flag(acl.clone_input), clone_output=_flag(acl.enable_output_clone),
        capture_limit=int(_raw(acl.static_capture_size_limit)), frozen_parameter=_flag(experimental.frozen_parameter),
        disable_inplaceable_pass=_flag(acl.disable_reinplace_inplaceable_ops_pass),
        disable_input_mutated_pass=_flag(acl.disable_reinplace_input_mutated_ops_pass),
        static_kernel=_flag(experimental.aclgraph._aclnn_static_shape_kernel),
        super_kernel_optimize=_flag(experimental.aclgraph._super_kernel_optimize),
        super_kernel_optimize_options=_raw(experimental.aclgraph._super_kernel_optimize_options),
        super_kernel_debug_options=_raw(experimental.aclgraph._super_kernel_debug_options),
        cann_ge_9=cann_ge_9, deadlock_check=_flag(debug.deadlock_check),
        aicore_num=_raw(config.ge_config.aicore_num),
        data_dump_path=_raw(config.dump_config.dump_path) if _flag(config.dump_config.enable_dump) else None,
        data_dump_stage=_raw(config.dump_config.data_dump_stage), dump_mode=_raw(config.dump_config.dump_mode),
        dump_step=_raw(config.dump_config.dump_step), dump_layer=_raw(config.dump_config.dump_layer),
        export=_export(config.export), ge_options=_ge_options(config))


def _ge_options(config) -> tuple:
    """The config's GE options as (local items, global items), read once (ge_options.py logs them)."""
    local, glob = config.as_dict()
    return tuple(local.items()), tuple(glob.items())


def _export(export) -> Optional[tuple]:
    if not _flag(export.export_mode):
        return None
    return (_raw(export.export_path_dir), export.export_name or "export", dict(export.weight_name or {}))


def _from_npugraph_ex(config, backend: str, cann_ge_9: bool) -> Settings:
    pool = config.use_graph_pool
    return Settings(
        mode="npugraph_ex", backend=backend,
        pre_pass=_raw(config.post_grad_custom_pre_pass), post_pass=_raw(config.post_grad_custom_post_pass),
        remove_noop_ops=_flag(config.remove_noop_ops), pattern_fusion=_flag(config.pattern_fusion_pass),
        keep_inference_input_mutations=True,
        config=config, run_eagerly=_flag(config.force_eager),
        custom_pool=pool, reuse_pool_in_fx=pool is None and _flag(config.reuse_graph_pool_in_same_fx),
        clone_input=_flag(config.clone_input), clone_output=_flag(config.clone_output),
        capture_limit=int(_raw(config.capture_limit)), frozen_parameter=_flag(config.frozen_parameter),
        disable_inplaceable_pass=not _flag(config.inplace_pass),
        disable_input_mutated_pass=not _flag(config.input_inplace_pass),
        static_kernel=_flag(config.static_kernel_compile),
        super_kernel_optimize=_flag(config.super_kernel_optimize),
        super_kernel_optimize_options=_raw(config.super_kernel_optimize_options),
        super_kernel_debug_options=_raw(config.super_kernel_debug_options),
        cann_ge_9=cann_ge_9, deadlock_check=_flag(config.deadlock_check),
        force_recapture=_flag(config.force_recapture), capture_error_mode=_raw(config.capture_error_mode),
        data_dump_path=_raw(config.data_dump_dir) if _flag(config.dump_tensor_data) else None,
        data_dump_stage=_raw(config.data_dump_stage))
