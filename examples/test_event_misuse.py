"""Attention prolog overlap with events: waiting on an event before it is recorded.

``Event.wait`` on an event that was never recorded is a silent no-op on the device, so the
consumer stream is not ordered after the producer at all.
"""
import torch
import torch_npu


def prolog(x, wq, wkv, side, ready, record_first: bool):
    main = torch.npu.current_stream()
    if not record_first:
        side.wait_event(ready)              # bug: nothing recorded yet
    q = x @ wq
    ready.record(main)
    if record_first:
        side.wait_event(ready)
    with torch.npu.stream(side):
        kv = q @ wkv                        # consumes q, produced on the main stream
    main.wait_stream(side)
    return q, kv


def test_wait_before_record_is_caught(npugraph):
    x, wq, wkv = torch.randn(4, 16).npu(), torch.randn(16, 16).npu(), torch.randn(16, 32).npu()
    with npugraph.expect("event-misuse", match="never recorded"):
        with npugraph.expect("race", match="q @ wkv|aten::mm"):
            prolog(x, wq, wkv, torch.npu.Stream(), torch.npu.Event(), record_first=False)


def test_record_then_wait_is_clean(npugraph):
    x, wq, wkv = torch.randn(4, 16).npu(), torch.randn(16, 16).npu(), torch.randn(16, 32).npu()
    q, kv = prolog(x, wq, wkv, torch.npu.Stream(), torch.npu.Event(), record_first=True)
    torch.testing.assert_close(kv.cpu(), x.cpu() @ wq.cpu() @ wkv.cpu())
    npugraph.assert_clean()
