"""``torch_npu.atb``: the ATB ops torch_npu exports here rather than at its top level
(``_atb_ops.ATB_API_LIST``: ``torch_npu.atb.npu_multi_head_latent_attention`` is
``torch.ops.atb.npu_multi_head_latent_attention``); without math they raise ``NotImplementedError``."""


def __getattr__(name):
    from pytest_npugraph.runtime.ops import library as _ops, registry as _registry

    if _registry.atb_exports().get(name) == "torch_npu.atb":
        return _ops.packet(name)
    raise AttributeError(f"module 'torch_npu.atb' has no attribute '{name}'")


def __dir__():
    from pytest_npugraph.runtime.ops import registry as _registry

    exported = {name for name, where in _registry.atb_exports().items() if where == "torch_npu.atb"}
    return sorted(set(globals()) | exported)
