"""``torch.nn.parallel.comm`` and ``DataParallel`` on NPU tensors (issue 28): ``torch._C._scatter``,
``_gather``, ``_broadcast`` and ``_broadcast_coalesced`` as torch_npu adds them, made of device copies the
trace records (so a copy read on another stream without a wait is a race like any other).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.parallel.comm as comm
import torch_npu  # noqa: F401

pytestmark = pytest.mark.npu_devices(2)


def _copies(trace, device):
    return [r for r in trace.records if type(r).__name__ == "Kernel" and "copy" in r.op
            and trace.streams[r.stream].device == device]


def test_scatter_and_gather_move_chunks_between_devices(npugraph):
    x = torch.arange(12.0).reshape(6, 2).npu()
    parts = comm.scatter(x, devices=[0, 1], chunk_sizes=[2, 4])
    assert [p.device for p in parts] == [torch.device("npu", 0), torch.device("npu", 1)]
    assert parts[1].cpu().tolist() == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0], [10.0, 11.0]]
    assert _copies(npugraph.trace, 1)                    # chunk 1 copied onto npu:1
    back = comm.gather([p * 2 for p in parts], dim=0, destination=0)
    assert back.device == torch.device("npu", 0)
    assert back.cpu().tolist() == (x.cpu() * 2).tolist()
    assert comm.gather(list(parts), destination="cpu").device.type == "cpu"
    npugraph.assert_clean()


def test_broadcast_and_broadcast_coalesced(npugraph):
    a, b = torch.ones(3).npu(), torch.arange(2.0).npu()
    copies = comm.broadcast(a, devices=[0, 1])
    assert copies[0] is a and copies[1].device == torch.device("npu", 1) and copies[1].cpu().tolist() == [1.0] * 3
    per_device = comm.broadcast_coalesced([a, b], devices=[0, 1])
    assert per_device[0][0] is a and [t.device.index for t in per_device[1]] == [1, 1]
    assert per_device[1][1].cpu().tolist() == [0.0, 1.0]
    with pytest.raises(RuntimeError, match="chunk sizes don't sum up"):
        comm.scatter(a, devices=[0, 1], chunk_sizes=[1, 1])
    npugraph.assert_clean()


def test_a_scattered_chunk_read_on_another_stream_without_a_wait_races(npugraph):
    x = torch.arange(8.0).npu()
    side = torch.npu.Stream(device=1)
    with npugraph.expect("race"):
        parts = comm.scatter(x, devices=[0, 1])
        with torch.npu.stream(side):
            parts[1] + 1                                  # the copy onto npu:1 ran on its current stream


def test_data_parallel_replicates_and_gathers(npugraph):
    torch.manual_seed(0)
    model = nn.Linear(4, 3).npu()
    x = torch.randn(6, 4)
    out = nn.DataParallel(model, device_ids=[0, 1])(x.npu())
    assert out.device == torch.device("npu", 0)
    torch.testing.assert_close(out.cpu(), model.cpu()(x))
