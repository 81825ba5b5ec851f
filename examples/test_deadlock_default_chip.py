"""Seed 000's deadlock on the default chip (Ascend910B1), with no conftest.py profiles: HCCL in AIV
mode (``HCCL_OP_EXPANSION_MODE=AIV``) runs AllReduce and AlltoAll on the vector cores, holding them
until the peer card arrives, and stream limits give each collective its share (16 and 24 of 48).  A
NonZero on a third stream wants all 48 at once.  docs/hazards/deadlock.md shows this file.
"""
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.npu_devices(2)]      # the default chip: Ascend910B1, 48 vector cores


@pytest.fixture(autouse=True)
def aiv_mode(monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")    # read when a communicator is created


def step(rank, nonzero_limit=None):
    tp, ep = dist.new_group([0, 1]), dist.new_group([0, 1])
    grads = torch.arange(4.0, device="npu") * (rank + 1)
    tokens = torch.arange(4.0, device="npu") + 10 * rank
    mask = (torch.arange(12, device="npu") % 3) == rank
    main = torch.npu.current_stream()
    tp_stream, ep_stream, mask_stream = torch.npu.Stream(), torch.npu.Stream(), torch.npu.Stream()
    torch.npu.set_stream_limit(tp_stream, vector_num=16)        # the all-reduce's share
    torch.npu.set_stream_limit(ep_stream, vector_num=24)        # the all-to-all's share
    if nonzero_limit:
        torch.npu.set_stream_limit(mask_stream, vector_num=nonzero_limit)    # the fix
    for s in (tp_stream, ep_stream, mask_stream):
        s.wait_stream(main)
    received = torch.empty(4, device="npu")

    def all_reduce():
        with torch.npu.stream(tp_stream):
            dist.all_reduce(grads, group=tp)

    def all_to_all():
        with torch.npu.stream(ep_stream):
            dist.all_to_all_single(received, tokens, group=ep)

    for launch in ((all_reduce, all_to_all) if rank == 0 else (all_to_all, all_reduce)):
        launch()                                        # card 0: TP first; card 1: EP first
    with torch.npu.stream(mask_stream):
        kept = torch.nonzero(mask)                      # NonZero: all its blocks resident at once
    for s in (tp_stream, ep_stream, mask_stream):
        main.wait_stream(s)
    return grads.cpu(), received.cpu(), kept.cpu()


def test_nonzero_beside_two_aiv_collectives_deadlocks_the_cards(npugraph):
    with npugraph.expect("deadlock", match=r"npu:0, npu:1 can block each other forever(.|\n)*"
                                           r"cause: 3 ops on npu:0, npu:1 may run at the same time and need 88 "
                                           r"vector cores together, but the device has 48(.|\n)*"
                                           r"fix: limit aten::nonzero .* to 8 vector cores"):
        npugraph.run_ranks(step)


def test_nonzero_limited_to_the_free_cores_is_clean_and_correct(npugraph):
    results = npugraph.run_ranks(step, 8)
    for rank, (grads, received, kept) in enumerate(results):
        assert grads.tolist() == (torch.arange(4.0) * 3).tolist()                 # 1x + 2x
        assert received.tolist() == [0.0 + 2 * rank, 1.0 + 2 * rank, 10.0 + 2 * rank, 11.0 + 2 * rank]
        assert kept.flatten().tolist() == torch.nonzero(torch.arange(12) % 3 == rank).flatten().tolist()
    npugraph.assert_clean()
