"""A multi-rank ``hccl`` init in the test's own thread fails at once, pointing at npugraph.run_ranks
(before: torch's env:// rendezvous waited for rank 1 until killed)."""
import time

import pytest
import torch
import torch.distributed as dist
import torch_npu  # noqa: F401


@pytest.mark.parametrize("call", [
    lambda: dist.init_process_group("hccl", rank=0, world_size=2),
    lambda: dist.init_process_group(backend="hccl", init_method="env://", rank=0, world_size=4),
    lambda: dist.init_process_group("cpu:gloo,npu:hccl", rank=0, world_size=2),
    lambda: dist.init_process_group(rank=0, world_size=2),
], ids=["positional", "env-method", "mixed-backends", "default-backend"])
def test_init_outside_run_ranks_fails_at_once(npugraph, monkeypatch, call):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29517")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"outside npugraph\.run_ranks.*npugraph\.run_ranks\(fn\)"):
        call()
    assert time.monotonic() - start < 60   # generous (load must not fail it): the bug waited until killed
    assert not dist.is_initialized()


def test_world_size_from_the_environment(npugraph, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29518")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="world_size=2"):
        dist.init_process_group("hccl")


def test_a_one_rank_world_and_run_ranks_still_work(npugraph, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29519")
    dist.init_process_group("hccl", rank=0, world_size=1)
    try:
        x = torch.ones(2, device="npu")
        dist.all_reduce(x)
        assert x.cpu().tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


@pytest.mark.npu_devices(2)
def test_run_ranks_inits_hccl_worlds(npugraph):
    def rank_fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=2)
        x = torch.full((2,), float(rank + 1), device=f"npu:{rank}")
        dist.all_reduce(x)
        dist.destroy_process_group()
        return x.cpu().tolist()
    assert npugraph.run_ranks(rank_fn) == [[3.0, 3.0], [3.0, 3.0]]


def test_gloo_worlds_are_not_touched(npugraph, monkeypatch):
    from torch_npu.distributed import _outside_run_ranks
    import inspect
    bound = inspect.signature(dist.init_process_group).bind("gloo", rank=0, world_size=2)
    assert _outside_run_ranks(bound) is None
