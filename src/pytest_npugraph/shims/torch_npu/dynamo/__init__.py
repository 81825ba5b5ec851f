"""``torch_npu.dynamo``: the real package bundles TorchAir (``torch_npu.dynamo.torchair``) and npugraph_ex
(``torch_npu.dynamo.npugraph_ex``) here."""


def __getattr__(name):
    if name == "torchair":
        import torchair

        return torchair
    if name == "npugraph_ex":
        import importlib

        return importlib.import_module("torch_npu.dynamo.npugraph_ex")
    raise AttributeError(f"module 'torch_npu.dynamo' has no attribute '{name}'")
