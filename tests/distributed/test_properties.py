"""Random shapes, splits and routings against the straightforward computation (hypothesis).

Why: split sizes, uneven token counts per rank, masks and expert placement are where the
exchange's index arithmetic goes wrong; hand-picked cases cover few of them.  Three ranks,
so nothing relies on a power of two.
"""
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_npu

WORLD = 3
pytestmark = pytest.mark.npu_devices(WORLD)
EXAMPLES = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@EXAMPLES
@given(splits=st.lists(st.lists(st.integers(0, 3), min_size=WORLD, max_size=WORLD), min_size=WORLD, max_size=WORLD),
       width=st.integers(1, 3), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64]))
def test_all_to_all_single_moves_every_row_to_its_receiver(npugraph, splits, width, dtype):
    """``splits[q][r]``: rows rank q sends rank r; row values name (sender, receiver, index)."""
    def rows(q, r):
        return torch.tensor([[100 * q + 10 * r + i] * width for i in range(splits[q][r])], dtype=dtype).view(-1, width)

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        send = torch.cat([rows(rank, r) for r in range(WORLD)]).npu()
        recv = [splits[q][rank] for q in range(WORLD)]
        out = torch.empty(sum(recv), width, dtype=dtype, device="npu")
        dist.all_to_all_single(out, send, recv, splits[rank])
        return out.cpu()

    for rank, out in enumerate(npugraph.run_ranks(fn)):
        torch.testing.assert_close(out, torch.cat([rows(q, rank) for q in range(WORLD)]))


@st.composite
def routings(draw):
    """Per rank: token count (ranks differ), top-k distinct experts per token, an active mask."""
    local, k = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    experts = local * WORLD
    k = min(k, experts)
    ranks = []
    for _ in range(WORLD):
        n = draw(st.integers(1, 4))
        ids = [draw(st.permutations(range(experts)))[:k] for _ in range(n)]
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        ranks.append((n, ids, mask))
    return experts, k, ranks


@EXAMPLES
@given(routing=routings())
def test_dispatch_combine_round_trip_with_uneven_tokens_and_masks(npugraph, routing):
    experts, k, ranks = routing
    hidden = 4
    global_bs = max(n for n, _, _ in ranks) * WORLD

    def tensors(rank):
        n, ids, mask = ranks[rank]
        g = torch.Generator().manual_seed(rank)
        return (torch.randn(n, hidden, generator=g), torch.tensor(ids, dtype=torch.int32),
                torch.rand(n, k, generator=g), torch.tensor(mask))

    def fn(rank):
        dist.init_process_group("hccl", rank=rank, world_size=WORLD)
        group_ep = dist.group.WORLD._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
        x, ids, scales, mask = (t.npu() for t in tensors(rank))
        expand_x, _, expand_idx, token_nums, recv_counts, _, expand_scales = torch_npu.npu_moe_distribute_dispatch(
            x, ids, group_ep, WORLD, rank, experts, x_active_mask=mask, expert_scales=scales, global_bs=global_bs)
        # expert e scales its rows by (e + 1): the combine must bring each row back to its token
        local = experts // WORLD
        factors = torch.repeat_interleave(torch.arange(rank * local, (rank + 1) * local) + 1.0,
                                          token_nums.cpu(), output_size=int(token_nums.sum().item()))
        processed = expand_x.clone()
        processed[:factors.numel()] *= factors.unsqueeze(1).npu()
        out = torch_npu.npu_moe_distribute_combine(processed, ids, expand_idx, recv_counts, scales, group_ep, WORLD,
                                                   rank, experts, x_active_mask=mask, global_bs=global_bs)
        return out.cpu(), int(token_nums.sum()), expand_scales.cpu()

    results = npugraph.run_ranks(fn)
    for rank, (out, _, _) in enumerate(results):
        x, ids, scales, mask = tensors(rank)
        expected = (x.unsqueeze(1) * (ids.float() + 1).unsqueeze(-1) * scales.unsqueeze(-1)).sum(1)
        torch.testing.assert_close(out, expected * mask.unsqueeze(-1), rtol=1e-5, atol=1e-5)
    sent = sum(sum(mask) * k for _, _, mask in ranks)
    assert sum(received for _, received, _ in results) == sent
    sent_scales = sorted(float(s) for r in range(WORLD) for s, m in
                         zip(tensors(r)[2].flatten(), tensors(r)[3].repeat_interleave(k)) if m)
    received_scales = sorted(float(s) for _, n, es in results for s in es[:n])
    assert received_scales == pytest.approx(sent_scales)
