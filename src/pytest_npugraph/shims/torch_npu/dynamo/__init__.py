"""``torch_npu.dynamo``: the real package bundles TorchAir here (``torch_npu.dynamo.torchair``)."""


def __getattr__(name):
    if name == "torchair":
        import torchair

        return torchair
    raise AttributeError(f"module 'torch_npu.dynamo' has no attribute '{name}'")
