"""``torch.npu.npugraph_ex`` (mirrors ``torch_npu/npu/npugraph_ex``): ``compile_fx``,
``register_replacement``, ``scope`` (``limit_core_num``, ``deterministic``) and ``inference``."""
__all__ = ["compile_fx", "register_replacement"]

from . import inference, scope  # noqa: F401


def compile_fx(gm, example_inputs=None, options=None):
    import npugraph_ex

    return npugraph_ex.compile_fx(gm, example_inputs, options)


def register_replacement(search_fn, replace_fn, example_inputs, trace_fn=None, extra_check=None,
                         search_fn_pattern=None, scalar_workaround=None, skip_duplicates=False):
    import npugraph_ex

    return npugraph_ex.register_replacement(search_fn, replace_fn, example_inputs, trace_fn=trace_fn,
                                            extra_check=extra_check, search_fn_pattern=search_fn_pattern,
                                            scalar_workaround=scalar_workaround, skip_duplicates=skip_duplicates)
