"""One base class for "the emulator does not model this" (``pytest_npugraph.NotEmulated``), distinct from
the errors that mirror torch_npu's and TorchAir's (issue 27)."""
import pytest
import torch
import torch_npu
import torchair

from pytest_npugraph import NotEmulated


def test_an_op_without_cpu_math_is_not_emulated(npugraph):
    x = torch.randn(4, device="npu")
    with pytest.raises(NotEmulated, match="npu_mish.*has no CPU implementation(.|\n)*pytest_npugraph_register_ops"):
        torch_npu.npu_mish(x)


def test_an_api_the_emulator_does_not_model_is_not_emulated():
    from torchair.llm_datadist import create_npu_tensors

    with pytest.raises(NotEmulated, match="does not emulate LLM-DataDist"):
        create_npu_tensors([2, 2], torch.float16, [0x1000])


def test_not_emulated_is_caught_as_not_implemented():
    assert issubclass(NotEmulated, NotImplementedError)


def test_errors_mirroring_the_real_products_are_not_not_emulated(npugraph):
    """A bad argument is torch_npu's error (its type and message), not the emulator's."""
    stream = torch.npu.Stream()
    with pytest.raises(TypeError, match="an integer is required") as info:     # torch_npu's pybind error
        torch.npu.set_stream_limit(stream, cube_num="many")
    assert not isinstance(info.value, NotEmulated)
