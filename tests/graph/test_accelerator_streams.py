"""Native stream code compiled with the eager and aot_eager backends, and ``torch.accelerator``'s
stream API on the emulated npu device.

Why: Dynamo hands its ``streams::`` ops the current stream as a plain ``torch.Stream`` from
``torch.accelerator.current_stream()``; torch's own answers stream 0 whatever stream is current and
its methods reach no NPU runtime, so a correct ``cur.wait_stream(side)`` inside a region compiled
with ``backend="eager"`` waited on nothing and the plugin reported a race on correct code."""
import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.trace import EventWait, HostSync

BACKENDS = ["eager", "aot_eager", "npugraph_ex"]


def _side_matmul(x, w, side):
    cur = torch.npu.current_stream()
    side.wait_stream(cur)
    with torch.npu.stream(side):
        y = x @ w
    cur.wait_stream(side)
    return y + x


def _side_matmul_no_join(x, w, side):
    cur = torch.npu.current_stream()
    side.wait_stream(cur)
    with torch.npu.stream(side):
        y = x @ w
    return y + x                          # the bug: the current stream never waits for the side stream


def _inputs():
    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    return x, w, x @ w + x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("outer", [False, True], ids=["default-stream", "inside-a-stream-context"])
def test_a_correct_join_in_a_compiled_region_stays_silent(npugraph, backend, outer):
    x, w, want = _inputs()
    side, around = torch.npu.Stream(), torch.npu.Stream()
    compiled = torch.compile(_side_matmul, backend=backend)
    if outer:
        around.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(around):
            got = compiled(x.npu(), w.npu(), side)
        torch.npu.current_stream().wait_stream(around)
    else:
        got = compiled(x.npu(), w.npu(), side)
    torch.testing.assert_close(got.cpu(), want)
    npugraph.assert_clean()
    if backend != "npugraph_ex":
        waits = [r for r in npugraph.trace.records if type(r) is EventWait]
        assert len(waits) >= 2                 # the region's two wait_stream calls reached the runtime


# aot_eager is left out: AOTAutograd's graph keeps no stream switches (Dynamo puts the stream in node
# metadata, which only inductor and npugraph_ex read), so the region runs on one stream, as on hardware
@pytest.mark.parametrize("backend", ["eager", "npugraph_ex"])
def test_a_missing_join_in_a_compiled_region_is_a_race(npugraph, backend):
    x, w, _ = _inputs()
    x, w = x.npu(), w.npu()
    side = torch.npu.Stream()
    compiled = torch.compile(_side_matmul_no_join, backend=backend)
    with npugraph.expect("race", match="aten::mm"):
        compiled(x, w, side).sum()


def test_accelerator_current_stream_is_the_emulated_current_stream(npugraph):
    def names(stream):
        return type(stream), stream.stream_id, stream.device_index

    side = torch.npu.Stream()
    plain = torch.Stream
    assert names(torch.accelerator.current_stream()) == (plain, 0, 0)
    with torch.npu.stream(side):
        for device in (None, "npu:0", 0, torch.device("npu", 0)):
            assert names(torch.accelerator.current_stream(device)) == (plain, side.stream_id, 0)
    torch.accelerator.set_stream(side)
    assert torch.npu.current_stream() == side
    torch.accelerator.set_stream(torch.accelerator.current_stream())     # a plain torch.Stream
    assert torch.npu.current_stream() == side
    torch.accelerator.set_stream(torch.npu.default_stream())
    assert torch.npu.current_stream() == torch.npu.default_stream()


def test_accelerator_synchronize_is_a_host_sync(npugraph):
    y = torch.arange(4.0, device="npu") * 2
    z = y.to("cpu", non_blocking=True)
    torch.accelerator.synchronize()
    assert z.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert any(type(r) is HostSync and r.what == "device" for r in npugraph.trace.records)
    npugraph.assert_clean()


def test_a_plain_torch_stream_of_the_npu_device_can_be_waited_on_and_recorded_on(npugraph):
    x = torch.ones(4, device="npu")
    side = torch.npu.Stream()
    plain = torch.Stream(stream_id=0, device_index=0, device_type=torch.npu.default_stream().device_type)
    side.wait_stream(plain)
    with torch.npu.stream(side):
        y = x * 2
    done = torch.npu.Event()
    done.record(side)
    done.wait(plain)
    assert (y + 1).sum().item() == 12.0
    npugraph.assert_clean()
