"""Point-to-point between rank threads (issue 28): ``send``/``recv``, ``isend``/``irecv`` and
``batch_isend_irecv`` as asynchronous tasks on the ranks' streams, paired as HCCL pairs them: the n-th
send from a rank to another with that rank's n-th receive from it.

Why: pipeline parallelism (vLLM PP, MindSpeed) hands activations between stages this way; an
unmatched send or two ranks that both send first hang on hardware, and must be reported, not waited on.
"""
import re

import pytest
import torch
import torch.distributed as dist
import torch_npu  # noqa: F401

from pytest_npugraph.runtime.collectives import CollectiveError
from pytest_npugraph.runtime.executor import DeviceHang

pytestmark = pytest.mark.npu_devices(2)


def _values(rank):
    return torch.arange(4.0).npu() * (rank + 1)


def test_send_recv_in_matching_order_exchanges_values_cleanly(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        out = torch.zeros(4).npu()
        if rank == 0:
            dist.send(_values(rank), dst=1)
            dist.recv(out, src=1)
        else:
            dist.recv(out, src=0)
            dist.send(_values(rank), dst=0)
        return out.cpu().tolist()
    assert npugraph.run_ranks(rank_fn) == [[0.0, 2.0, 4.0, 6.0], [0.0, 1.0, 2.0, 3.0]]
    kernels = [r for r in npugraph.trace.records if getattr(r, "op", "") in ("hccl::send", "hccl::recv")]
    assert sorted((k.op, k.collective) for k in kernels) == [
        ("hccl::recv", ("hccl/0/p2p:0->1", 0)), ("hccl::recv", ("hccl/0/p2p:1->0", 0)),
        ("hccl::send", ("hccl/0/p2p:0->1", 0)), ("hccl::send", ("hccl/0/p2p:1->0", 0))]
    npugraph.assert_clean()


def test_isend_irecv_are_asynchronous_and_pair_in_issue_order(npugraph):
    """Two sends 0 -> 1 pair with rank 1's two receives in order; the host of rank 0 goes on at once."""
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        a, b = torch.zeros(2).npu(), torch.zeros(3).npu()
        if rank == 0:
            works = [dist.isend(torch.tensor([1.0, 2.0]).npu(), dst=1), dist.isend(torch.tensor([3.0, 4.0, 5.0]).npu(), dst=1)]
        else:
            works = [dist.irecv(a, src=0), dist.irecv(b, src=0)]
        for w in works:
            w.wait()
        return a.cpu().tolist() + b.cpu().tolist()
    assert npugraph.run_ranks(rank_fn)[1] == [1.0, 2.0, 3.0, 4.0, 5.0]
    npugraph.assert_clean()


def test_batch_isend_irecv_exchanges_without_deadlock_whatever_the_list_order(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        out = torch.zeros(4).npu()
        peer = 1 - rank
        ops = [dist.P2POp(dist.isend, _values(rank), peer), dist.P2POp(dist.irecv, out, peer)]
        for work in dist.batch_isend_irecv(ops):     # both ranks list their send first
            work.wait()
        return out.cpu().tolist()
    assert npugraph.run_ranks(rank_fn) == [[0.0, 2.0, 4.0, 6.0], [0.0, 1.0, 2.0, 3.0]]
    npugraph.assert_clean()


def test_both_ranks_sending_first_is_a_deadlock(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        out = torch.zeros(4).npu()
        dist.send(_values(rank), dst=1 - rank)      # each send waits for a receive queued behind the other's send
        dist.recv(out, src=1 - rank)
        return out.cpu()
    with npugraph.expect("deadlock", match="npu:0, npu:1 can block each other forever"):
        with pytest.raises(DeviceHang, match="device hang"):
            npugraph.run_ranks(rank_fn)


def test_the_hang_names_the_issuers_of_a_stuck_send_in_rank_order(npugraph):
    """Rank 1 issues both its calls before rank 0 issues any: the message still lists rank 0 first
    (the determinism harness saw the text follow the ranks' arrival order, seed 3 of 5)."""
    import threading

    issued = threading.Event()

    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        out = torch.zeros(4).npu()
        if rank == 0:
            assert issued.wait(30)
        dist.send(_values(rank), dst=1 - rank)
        dist.recv(out, src=1 - rank)
        if rank == 1:
            issued.set()
        return out.cpu()
    with npugraph.expect("deadlock"):
        with pytest.raises(DeviceHang) as raised:
            npugraph.run_ranks(rank_fn)
    stuck = re.findall(r"\('hccl/0/p2p:[01]->[01]'\): issued by rank (\d) at \S+, rank (\d) at", str(raised.value))
    assert stuck == [("0", "1"), ("0", "1")]


def test_a_send_never_received_is_reported_not_waited_on(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        if rank == 0:
            dist.send(_values(rank), dst=1)
    with npugraph.expect("deadlock", match="npu:1, which never issues it"):
        with pytest.raises(DeviceHang, match=r"send #0 from rank 0 to rank 1 .*never issued by rank 1"):
            npugraph.run_ranks(rank_fn)


def test_a_receive_of_another_size_is_an_error(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        if rank == 0:
            dist.send(_values(rank), dst=1)
        else:
            dist.recv(torch.zeros(3).npu(), src=0)
        torch.npu.synchronize()
    with pytest.raises(CollectiveError, match=r"rank 0 sends 4 float32 elements but rank 1 receives 3 float32(.|\n)*issued recv at"):
        npugraph.run_ranks(rank_fn)


def test_recv_from_any_source_is_refused_as_hccl_does(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        if rank == 1:
            dist.recv(torch.zeros(4).npu())
    with pytest.raises(RuntimeError, match="does not support recv from any source"):
        npugraph.run_ranks(rank_fn)


def test_batch_isend_irecv_items_to_the_rank_itself_are_local_copies(npugraph):
    """torch_npu's test_dist_batch_isend_irecv: every rank sends to and receives from every rank, itself
    included (HcclBatchSendRecv takes such items); the receive from itself gets its own send."""
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        received = [torch.full((peer + 1,), -1.0).npu() for peer in range(2)]
        ops = []
        for peer in range(2):
            ops.append(dist.P2POp(dist.irecv, received[peer], peer))
            ops.append(dist.P2POp(dist.isend, torch.full((rank + 1,), 10.0 * rank + peer).npu(), peer))
        works = dist.batch_isend_irecv(ops)
        for work in works:
            work.wait()
        return [t.cpu().tolist() for t in received]
    assert npugraph.run_ranks(rank_fn) == [[[0.0], [10.0, 10.0]], [[1.0], [11.0, 11.0]]]
    npugraph.assert_clean()


def test_batch_isend_irecv_refuses_an_internal_format_view_before_any_item(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        torch_npu.npu.config.allow_internal_format = True
        view = torch_npu.npu_format_cast(torch.zeros(4, 4).npu(), 29)[2:]
        ops = [dist.P2POp(dist.irecv, torch.zeros(2, 4).npu(), rank), dist.P2POp(dist.isend, view, rank)]
        with pytest.raises(RuntimeError, match="For a tensor of internal format, it's storage_offset must be 0"):
            dist.batch_isend_irecv(ops)
    npugraph.run_ranks(rank_fn)
