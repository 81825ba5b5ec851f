"""Turn on the emulated torch_npu outside pytest (for benchmark scripts)."""
from pytest_npugraph import activation
from pytest_npugraph._context import CONTEXT, TestConfig


def start(devices: int = 1):
    activation.activate()
    CONTEXT.emulating = True
    CONTEXT.begin(TestConfig(device_count=devices))
    import torch_npu  # noqa: F401

    from pytest_npugraph.runtime.runtime import current

    return current()
