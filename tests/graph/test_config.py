"""CompilerConfig (torchair_api.md §3): field names, defaults, value checks and error texts, the
support warnings of get_npu_backend, and the npugraph_ex ``options=`` mapping."""
import pytest
import torch
import torchair
from torchair.configs.compiler_config import CompilerConfig
from torchair.configs.npugraphex_config import _NpuGraphExConfig, _process_kwargs_options


def test_importable_from_torchair_and_configs_module():
    assert torchair.CompilerConfig is CompilerConfig
    assert torchair.get_npu_backend is not None and torchair.get_compiler is not None
    from torch_npu.dynamo import torchair as bundled

    assert bundled is torchair


def test_defaults_read_as_torchair_option_strings():
    c = CompilerConfig()
    assert c.mode.value == "max-autotune"
    a = c.debug.aclgraph
    assert (a.clone_input.value, a.enable_output_clone.value, a.disable_mempool_reuse_in_same_fx.value) == ("1", "0", "0")
    assert a.static_capture_size_limit.value == "64"
    assert (a.disable_reinplace_inplaceable_ops_pass.value, a.disable_reinplace_input_mutated_ops_pass.value) == ("0", "0")
    assert a.remove_cat_ops.value == "1"
    assert c.aclgraph_config.use_custom_pool is None
    assert c.debug.graph_dump.type.value is None and c.debug.run_eagerly.value == "0"
    assert c.experimental_config.frozen_parameter.value == "0"
    assert c.experimental_config.keep_inference_input_mutations.value == "1"
    assert c.ge_config.aicore_num.value is None
    assert c.post_grad_custom_pre_pass.value is None


def test_value_outside_the_optional_list_raises_value_error():
    c = CompilerConfig()
    with pytest.raises(ValueError, match=r"^Value 'test' \(type: <class 'str'>\) not in optional list "
                                         r"\['max-autotune', 'reduce-overhead', 'npugraph_ex'\] \(type: <class 'str'>\)\."):
        c.mode = "test"
    with pytest.raises(ValueError, match=r"Value 'yes' \(type: <class 'str'>\) not in optional list \[True, False\] "
                                         r"\(type: <class 'bool'>\)\."):
        c.debug.aclgraph.clone_input = "yes"
    c.debug.aclgraph.clone_input = 0          # `in` accepts 0/1 for [True, False]
    assert c.debug.aclgraph.clone_input.value == "0"


def test_int_range_and_type_errors():
    a = CompilerConfig().debug.aclgraph
    with pytest.raises(ValueError, match=r"Please set integer type, but got <class 'str'>"):
        a.static_capture_size_limit = "3"
    with pytest.raises(ValueError, match=r"Please set value in \[1, 9223372036854775807\], 0 is out of range\."):
        a.static_capture_size_limit = 0
    a.static_capture_size_limit = 3
    assert a.static_capture_size_limit.value == "3"
    c = CompilerConfig()
    with pytest.raises(TypeError, match="value must be Callable or None, got <class 'int'>"):
        c.post_grad_custom_pre_pass = 3
    with pytest.raises(TypeError, match=r"the set value must be int list, got list type: \[<class 'str'>\]"):
        c.experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range = ["a"]


def test_unknown_option_names_every_option_and_keeps_the_error_type():
    c = CompilerConfig()
    with pytest.raises(ValueError) as info:
        c.no_such_option = 1
    text = str(info.value)
    assert text.startswith("CompilerConfig has no option no_such_option, all options ['debug', 'aoe_config', "
                           "'export', 'dump_config', 'fusion_config', 'experimental_config', 'inference_config', "
                           "'ge_config', 'mode', 'post_grad_custom_pre_pass', 'post_grad_custom_post_pass', "
                           "'post_grad_custom_pre_pass', 'post_grad_custom_post_pass']")
    assert "ERR03001 GRAPH" in text or "TORCH_NPU_COMPACT_ERROR_OUTPUT" in text or text.count("\n") > 1
    with pytest.raises(ValueError, match="_AclGraphDebugConfig has no option clone_inputs"):
        c.debug.aclgraph.clone_inputs = True


def test_dump_path_must_exist(tmp_path):
    c = CompilerConfig()
    with pytest.raises(FileNotFoundError, match="Please set legal dir path, /no/such is not found or is not a file "
                                                "directory!"):
        c.dump_config.dump_path = "/no/such"
    c.dump_config.dump_path = str(tmp_path)


def test_reduce_overhead_warns_about_ge_only_options_and_deprecation():
    c = CompilerConfig()
    c.mode = "reduce-overhead"
    c.ge_config.aicore_num = "12|24"
    with pytest.warns(UserWarning, match=r"may not take effect or report error in reduce-overhead mode: .*"
                                         r"config\.ge_config\.aicore_num:12\|24.*, set_dim_gears, dynamo_export, "
                                         r"scope, npu_print"), \
            pytest.warns(DeprecationWarning, match='"reduce-overhead" mode configuration will be deprecated'):
        torchair.get_npu_backend(compiler_config=c)


def test_ge_mode_warns_about_aclgraph_only_options():
    c = CompilerConfig()
    c.debug.aclgraph.clone_input = False
    with pytest.warns(UserWarning, match=r"in max-autotune mode: config\.debug\.aclgraph\.clone_input:False$"):
        torchair.get_npu_backend(compiler_config=c)


def test_npugraph_ex_options_map_onto_the_config():
    c = CompilerConfig()
    _process_kwargs_options(c, {"options": {"clone_output": True, "reuse_graph_pool_in_same_fx": False,
                                            "capture_limit": 5, "inplace_pass": 0, "force_eager": True}})
    a = c.debug.aclgraph
    assert a.enable_output_clone.value == "1" and a.disable_mempool_reuse_in_same_fx.value == "1"
    assert a.static_capture_size_limit.value == "5" and a.disable_reinplace_inplaceable_ops_pass.value == "1"
    assert c.debug.run_eagerly.value == "1"
    assert _NpuGraphExConfig.capture_limit == 5           # written onto the class too, as torchair does
    _NpuGraphExConfig.capture_limit = 64


def test_npugraph_ex_invalid_option_and_invalid_value():
    with pytest.raises(ValueError, match=r"Invalid option 'nope', allowed options: \['_vllm_aclnn_static_kernel"):
        _process_kwargs_options(CompilerConfig(), {"options": {"nope": 1}})
    with pytest.raises(ValueError, match=r"Value 'test' .*not in optional list \[True, False\]"):
        _process_kwargs_options(CompilerConfig(), {"options": {"inplace_pass": "test"}})
    _NpuGraphExConfig.inplace_pass = True


def test_invalid_custom_pool_is_rejected_when_the_graph_is_built(npugraph):
    from .helpers import compile_with, config

    c = config("reduce-overhead")
    c.aclgraph_config.use_custom_pool = "pool"
    f = compile_with(lambda x: x + 1, c)
    with pytest.raises(Exception, match=r"Invalid graph pool handle type, got value=pool, type=str"):
        f(torch.ones(2, device="npu"))


def test_logger_is_torchairs(caplog):
    import logging

    from torchair.core.utils import logger

    assert logger is torchair.logger and logger.name == "torchair"
    assert logger.level == logging.ERROR          # DEBUG only with TORCH_COMPILE_DEBUG=1
    assert any("TORCHAIR(" in h.formatter._fmt for h in logger.handlers)
    logger.setLevel(logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG, logger="torchair"):
            logger.debug("hello")
        assert "hello" in caplog.text
    finally:
        logger.setLevel(logging.ERROR)


# ---------------------------------------------------------------- the compiler's settings snapshot
def _leaves(c):
    from torchair.configs.compiler_config import _get_all_leaf_properties

    return dict(_get_all_leaf_properties(c))


def test_compiling_with_options_and_custom_pool_never_changes_the_users_config(npugraph):
    c = CompilerConfig()
    c.mode = "reduce-overhead"
    c.aclgraph_config.use_custom_pool = torch.npu.graph_pool_handle()
    before = _leaves(c)
    backend = torchair.get_npu_backend(compiler_config=c)
    out = torch.compile(lambda x: x + 1, backend=backend, fullgraph=True, dynamic=False,
                        options={"clone_output": True, "inplace_pass": False})(torch.ones(2, device="npu"))
    assert out.cpu().tolist() == [2.0, 2.0]
    assert _leaves(c) == before
    assert backend.keywords["settings"].reuse_pool_in_fx is False      # the custom pool turned it off
    assert backend.keywords["settings"].clone_output is False          # options go to a copy, per compile


def test_settings_are_a_frozen_snapshot_taken_when_the_backend_is_made():
    import dataclasses

    c = CompilerConfig()
    c.mode = "reduce-overhead"
    c.debug.aclgraph.clone_input = False
    c.debug.aclgraph.static_capture_size_limit = 3
    settings = torchair.get_npu_backend(compiler_config=c).keywords["settings"]
    assert (settings.mode, settings.clone_input, settings.capture_limit, settings.aclgraph) == (
        "reduce-overhead", False, 3, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.clone_input = True
