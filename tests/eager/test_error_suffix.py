"""torch_npu's error suffix (``pta_error``) on emulated errors (torch_npu_api.md §0)."""
import re

import pytest
import torch
import torch_npu  # noqa: F401

SUFFIX = (r"\n\[ERROR\] \d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2} \(PID:\d+, Device:(?P<device>-?\d+), "
          r"RankID:-1\) ERR(?P<code>\d{5}) PTA (?P<text>[a-z ]+)$")


def error_of(call):
    with pytest.raises(Exception) as info:
        call()
    return str(info.value)


def suffix(message):
    match = re.search(SUFFIX, message)
    assert match, f"no torch_npu error suffix in {message!r}"
    return match


@pytest.mark.parametrize("call, code, text", [
    (lambda: torch.npu.set_device("cpu"), "00003", "invalid value"),
    (lambda: torch.npu.get_device_name(5), "00003", "invalid value"),
    (lambda: torch.npu.set_device_limit(True), "00002", "invalid type"),
    (lambda: torch.npu.get_stream_limit(None), "00001", "invalid parameter"),
    (lambda: torch.npu.Stream().priority, "00007", "feature not supported"),
    (lambda: torch.npu.set_device(3), "00100", "call acl api failed"),
    (lambda: torch.npu.Event().elapsed_time(torch.npu.Event()), "00005", "internal error"),
    (lambda: torch.empty(1 << 61, dtype=torch.uint8, device="npu"), "00006", "memory error"),
])
def test_suffix_codes(npugraph, monkeypatch, call, code, text):
    monkeypatch.delenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", raising=False)
    match = suffix(error_of(call))
    assert (match["code"], match["text"]) == (code, text)


def test_suffix_names_the_current_device(npugraph, monkeypatch):
    monkeypatch.delenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", raising=False)
    assert suffix(error_of(lambda: torch.npu.set_device("cpu")))["device"] == "-1"   # nothing set yet
    torch.npu.init()
    assert suffix(error_of(lambda: torch.npu.set_device("cpu")))["device"] == "0"


@pytest.mark.npu_devices(2)
def test_suffix_device_follows_set_device(npugraph, monkeypatch):
    monkeypatch.delenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", raising=False)
    torch.npu.set_device(1)
    assert suffix(error_of(lambda: torch.npu.Stream().priority))["device"] == "1"


@pytest.mark.parametrize("value", ["1", "2", "-1"])
def test_compact_error_output_drops_the_suffix(npugraph, monkeypatch, value):
    monkeypatch.setenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", value)
    message = error_of(lambda: torch.npu.set_device("cpu"))
    assert message.startswith("Expected a npu device, but got: cpu")
    assert "[ERROR]" not in message and "\n" not in message
    oom = error_of(lambda: torch.empty(1 << 61, dtype=torch.uint8, device="npu"))
    assert oom.startswith("NPU out of memory. Tried to allocate more than 1EB memory.") and "[ERROR]" not in oom


def test_compact_error_output_zero_keeps_it(npugraph, monkeypatch):
    monkeypatch.setenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0")
    assert suffix(error_of(lambda: torch.npu.set_device("cpu")))["code"] == "00003"
