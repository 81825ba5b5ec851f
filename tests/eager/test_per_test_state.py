"""Per-test state lives in the runtime's stash: what one test made is not the next test's."""
from __future__ import annotations

import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.runtime.runtime import current

KEPT: dict = {}


def test_first_test_makes_a_tagged_stream_and_an_event(npugraph):
    from torchair.scope._scope_attr import _npu_get_or_create_stream_with_tag

    KEPT["stream"] = _npu_get_or_create_stream_with_tag("side")
    KEPT["event"] = torch.npu.Event()
    KEPT["event"].record()
    KEPT["runtime"] = current()
    assert _npu_get_or_create_stream_with_tag("side") is KEPT["stream"]   # one stream per tag in a test


def test_next_test_gets_its_own_tagged_stream_and_event_state(npugraph):
    from torchair.scope._scope_attr import _npu_get_or_create_stream_with_tag

    if "stream" not in KEPT:
        pytest.skip("runs after the previous test")
    assert current() is not KEPT["runtime"]
    stream = _npu_get_or_create_stream_with_tag("side")
    assert stream is not KEPT["stream"]
    assert stream._state.sid in npugraph.trace.streams          # a stream of this test's device
    _, state = KEPT["event"]._live()                               # the old handle still works ...
    assert not state.recorded                                     # ... as a fresh, never recorded event
