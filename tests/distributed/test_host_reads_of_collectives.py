"""Every host-reading op waits for a queued collective that writes what it reads.

The collective's math is slowed down so that the first rank's host reaches its read while the
collective is still running on the other rank's thread: a read that did not wait would see the
inputs (1.0) instead of the sum (2.0)."""
import time

import pytest
import torch
import torch.distributed as dist


def _item(t):
    return t.item()


def _cpu(t):
    return t.cpu()[0].item()


def _to_cpu(t):
    return t.to("cpu")[0].item()


def _tolist(t):
    return t.tolist()[0]


def _blocking_copy(t):
    host = torch.zeros(1)
    host.copy_(t)
    return host[0].item()


def _nonzero(t):
    return 2.0 if (t - 1.5).clamp(min=0).nonzero().numel() else 1.0   # a row only once the sum is there


def _masked_select(t):
    return t.masked_select(t > 1.5).cpu().numel() * 2.0      # 2.0 only once the sum is there


def _equal(t):
    return 2.0 if torch.equal(t, torch.full((1,), 2.0, device=t.device)) else 1.0


def _repr(t):
    return float(repr(t).split("[")[1].split("]")[0])


def _numpy_of_cpu(t):
    return float(t.cpu().numpy()[0])


READS = [_item, _cpu, _to_cpu, _tolist, _blocking_copy, _nonzero, _masked_select, _equal, _repr,
         _numpy_of_cpu]


@pytest.fixture
def slow_all_reduce(monkeypatch):
    from pytest_npugraph.runtime import collectives

    def slow(calls, math=collectives.MATH["all_reduce"]):
        time.sleep(0.03)
        math(calls)

    monkeypatch.setitem(collectives.MATH, "all_reduce", slow)


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("side", [False, True], ids=["current-stream", "side-stream"])
@pytest.mark.parametrize("read", READS, ids=[r.__name__.lstrip("_") for r in READS])
def test_a_host_read_of_a_collective_output_waits_for_the_collective(npugraph, slow_all_reduce, read, side):
    def fn(rank):
        seen = []
        stream = torch.npu.Stream() if side else torch.npu.current_stream()
        with torch.npu.stream(stream):
            for _ in range(3):
                t = torch.ones(1, device="npu")
                dist.all_reduce(t)
                seen.append(read(t))
        return seen

    assert npugraph.run_ranks(fn) == [[2.0] * 3] * 2
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_a_host_read_on_a_side_stream_waits_for_the_collective_on_that_stream(npugraph, slow_all_reduce):
    def fn(rank):
        side = torch.npu.Stream()
        with torch.npu.stream(side):
            t = torch.ones(1, device="npu")
            dist.all_reduce(t)
            return t.item()

    assert npugraph.run_ranks(fn) == [2.0, 2.0]


@pytest.mark.npu_devices(2)
def test_numpy_of_an_npu_tensor_raises_as_torch_does_for_a_device_tensor(npugraph):
    t = torch.ones(1, device="npu")
    with pytest.raises(TypeError, match=r"^can't convert npu:0 device type tensor to numpy\. Use Tensor\.cpu\(\) "
                                        r"to copy the tensor to host memory first\.$"):
        t.numpy()
