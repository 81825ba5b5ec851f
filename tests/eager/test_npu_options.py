"""torch.npu's runtime switches (torch_npu/npu/npu_config.py): set_compile_mode / is_jit_compile_false,
torch.npu.config.allow_internal_format, torch.npu.matmul / torch.npu.conv allow_hf32."""
import pytest
import torch
import torch_npu


def test_compile_mode_round_trips_and_starts_disabled_in_every_test(npugraph):
    assert torch.npu.is_jit_compile_false() is True
    torch_npu.npu.set_compile_mode(jit_compile=True)
    assert torch.npu.is_jit_compile_false() is False
    torch.npu.set_compile_mode(jit_compile=False)
    assert torch.npu.is_jit_compile_false() is True
    torch.npu.set_compile_mode(jit_compile=True)      # the next test starts with the default again


def test_compile_mode_of_the_previous_test_is_gone(npugraph):
    assert torch.npu.is_jit_compile_false() is True


def test_allow_internal_format_can_be_set_but_not_read(npugraph):
    torch.npu.config.allow_internal_format = True
    torch_npu.npu.config.allow_internal_format = False
    with pytest.raises(AttributeError):
        torch.npu.config.allow_internal_format


def test_hf32_switches(npugraph):
    assert torch.npu.matmul.allow_hf32 is False
    assert torch.npu.conv.allow_hf32 is True
    torch.npu.matmul.allow_hf32 = True
    torch.npu.conv.allow_hf32 = False
    assert torch.npu.matmul.allow_hf32 is True
    assert torch.npu.conv.allow_hf32 is False
    with pytest.raises(TypeError, match="allow_hf32 must be a bool, but got int"):
        torch.npu.matmul.allow_hf32 = 1
