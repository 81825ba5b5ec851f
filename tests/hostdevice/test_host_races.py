"""Host/device races: the host uses the CPU destination of a non_blocking device-to-host copy
before it knows the copy done (``race`` with the host as one party, host_races.py).

Why: ``z = y.to("cpu", non_blocking=True); z.sum().item()`` before any sync is a real vLLM-Ascend
bug; each "catches it" test has a twin with the fix that must stay silent."""
import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.analysis import analyze
from pytest_npugraph.trace import HostAccess


def _device_value():
    a = torch.arange(16.0, device="npu").reshape(4, 4)
    return a @ a


def _races(npugraph):
    """Every race in the test's trace so far, those absorbed by ``expect`` included."""
    return analyze(npugraph.trace, ["race"])


def test_a_host_read_of_a_non_blocking_d2h_destination_before_any_sync_is_a_race(npugraph):
    with npugraph.expect("race", match="host/device race"):
        y = _device_value()
        z = y.to("cpu", non_blocking=True)
        total = z.sum().item()                      # the bug: no sync before reading z
    race, = _races(npugraph)
    assert race.streams == ["npu:0/default", "host"]
    assert race.ops == ["aten::_to_copy (D2H)", "sum()"]
    assert len(race.where) == 2 and all("test_host_races.py:" in w for w in race.where)
    copy_line, read_line = (int(w.rsplit(":", 1)[1]) for w in race.where)
    assert read_line == copy_line + 1
    assert "torch.npu.default_stream().synchronize()" in race.message
    assert f"before {race.where[1]}" in race.message and "non_blocking=False" in race.message
    assert isinstance(total, float)


@pytest.mark.parametrize("sync", ["stream", "device", "event", "blocking-read"])
def test_a_host_read_after_the_host_knows_the_copy_done_stays_silent(npugraph, sync):
    y = _device_value()
    z = y.to("cpu", non_blocking=True)
    if sync == "stream":
        torch.npu.current_stream().synchronize()
    elif sync == "device":
        torch.npu.synchronize()
    elif sync == "event":
        done = torch.npu.Event()
        done.record()
        done.synchronize()
    else:
        y.sum().item()                          # a blocking read of the same stream after the copy
    assert z.sum().item() == (y.cpu()).sum().item()
    npugraph.assert_clean()


def test_a_blocking_d2h_copy_stays_silent(npugraph):
    y = _device_value()
    z = y.to("cpu")
    assert z.sum().item() == float((torch.arange(16.0).reshape(4, 4) @ torch.arange(16.0).reshape(4, 4)).sum())
    assert not any(isinstance(r, HostAccess) for r in npugraph.trace.records)
    npugraph.assert_clean()


def test_an_event_recorded_before_the_copy_does_not_cover_it(npugraph):
    with npugraph.expect("race", match="host/device race"):
        y = _device_value()
        before = torch.npu.Event()
        before.record()
        z = y.to("cpu", non_blocking=True)
        before.synchronize()                        # waits for work before the copy only
        z.max().item()
    assert len(_races(npugraph)) == 1


def test_a_sync_of_another_stream_does_not_cover_the_copy(npugraph):
    with npugraph.expect("race", match="host/device race"):
        y = _device_value()
        side = torch.npu.Stream()
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            z = y.to("cpu", non_blocking=True)
        torch.npu.current_stream().synchronize()    # the copy runs on `side`
        z.tolist()
    race, = _races(npugraph)
    assert race.streams[1] == "host" and "synchronize()" in race.message


def test_views_and_metadata_are_not_reads(npugraph):
    y = _device_value()
    z = y.to("cpu", non_blocking=True)
    row = z[1]
    assert z.shape == (4, 4) and z.dtype == torch.float32 and z.numel() == 16 and row.shape == (4,)
    torch.npu.current_stream().synchronize()
    assert row.tolist() == y[1].cpu().tolist()
    npugraph.assert_clean()


def test_a_read_through_a_view_before_the_sync_is_a_race(npugraph):
    with npugraph.expect("race", match="host/device race"):
        y = _device_value()
        z = y.to("cpu", non_blocking=True)
        row = z[1]
        row.sum()
    assert len(_races(npugraph)) == 1


def test_a_host_write_to_a_pending_destination_is_a_race(npugraph):
    with npugraph.expect("race", match="host/device race"):
        y = _device_value()
        z = y.to("cpu", non_blocking=True)
        z.zero_()                                   # the copy may land after this write
    race, = _races(npugraph)
    assert "writes" in race.message and race.ops[1] == "zero_()"


def test_after_the_sync_further_calls_record_nothing(npugraph):
    y = _device_value()
    z = y.to("cpu", non_blocking=True)
    torch.npu.current_stream().synchronize()
    for _ in range(5):
        z.sum()
    assert not any(isinstance(r, HostAccess) for r in npugraph.trace.records)
    npugraph.assert_clean()


def test_results_of_ops_on_the_destination_are_plain_tensors(npugraph):
    y = _device_value()
    z = y.to("cpu", non_blocking=True)
    torch.npu.synchronize()
    assert type(z + 1) is torch.Tensor and type(z.sum()) is torch.Tensor
    assert torch.equal(z.to("npu").cpu(), y.cpu())
    npugraph.assert_clean()


HOST_READS = {
    "numpy": lambda z: z.numpy(),
    "np.asarray": lambda z: __import__("numpy").asarray(z),
    "float": lambda z: float(z[1]),
    "compare": lambda z: z == 1,
    "repr": repr,
    "iterate": list,
    "index-item": lambda z: z[1].item(),
    "pickle": lambda z: __import__("pickle").dumps(z),
    "deepcopy": lambda z: __import__("copy").deepcopy(z),
    "clone": lambda z: z.clone(),
}


@pytest.mark.parametrize("read", list(HOST_READS))
def test_every_kind_of_host_read_of_a_pending_destination_is_one_race(npugraph, read):
    with npugraph.expect("race", match="host/device race: the host reads"):
        y = torch.arange(4.0, device="npu") * 2
        z = y.to("cpu", non_blocking=True)
        HOST_READS[read](z)
    assert len(_races(npugraph)) == 1
    torch.npu.current_stream().synchronize()
    assert torch.equal(torch.as_tensor(HOST_READS["clone"](z)), torch.tensor([0.0, 2.0, 4.0, 6.0]))
