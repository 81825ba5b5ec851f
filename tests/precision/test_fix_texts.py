"""Fix texts are code the user can paste at the named place, in the idiom of where the code ran."""
import re
import sys

import pytest
import torch
import torch_npu  # noqa: F401

from .test_reinplace_root_cause import Branches, run


def races(npugraph):
    return [h.message for h in npugraph.hazards if h.kind == "race"]


def no_stream_labels_in_code(message):
    snippets = re.findall(r"`([^`]*)`", message.split("Fix:", 1)[1])
    assert snippets and not any(re.search(r"npu:\d+/\S+\.(wait_stream|record_stream)", s) for s in snippets)


@pytest.mark.npu_allow("race")
def test_eager_fix_is_a_wait_stream_on_the_consumer(npugraph):
    x = torch.ones(64, device="npu")
    side = torch.npu.Stream()
    made = f"tests/precision/test_fix_texts.py:{sys._getframe().f_lineno - 1}"
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        x.mul_(2)
    x.sum()
    (message,) = races(npugraph)     # the stream is named by the line that made it
    assert f"`torch.npu.current_stream().wait_stream(<the stream made at {made}>)` just before line" in message
    no_stream_labels_in_code(message)


def step(x):
    x.add_(1)                       # one line, run on two streams


@pytest.mark.npu_allow("race")
def test_one_line_on_two_streams_is_not_told_to_wait_before_itself(npugraph):
    x = torch.ones(64, device="npu")
    side = torch.npu.Stream()
    made = f"tests/precision/test_fix_texts.py:{sys._getframe().f_lineno - 1}"
    side.wait_stream(torch.npu.current_stream())
    for stream in (side, torch.npu.current_stream()):
        with torch.npu.stream(stream):
            step(x)
    (message,) = races(npugraph)
    line = re.search(r"writing it in aten::add_\.Tensor at (\S+:\d+)", message).group(1)
    assert f"after line {line} and wait for it on npu:0/default before line {line}" not in message
    assert f"line {line} runs on npu:0/stream-0 and then on npu:0/default" in message
    assert message.endswith(f"(streams made at: npu:0/stream-0 at {made})")


@pytest.mark.npu_allow("race")
def test_reduce_overhead_fix_uses_tagged_events(npugraph):
    run(Branches())
    for message in races(npugraph):
        assert "torchair.ops.npu_tagged_event_record(ev)" in message and "wait_stream" not in message.split("Fix:")[1]
        no_stream_labels_in_code(message)
