"""What a model suite's conftest.py tells pytest-npugraph, and how the examples are organised.

* ``pytest_npugraph_op_profile``: the core figures of the collectives in seed 000 (reduce-scatter
  takes 16 vector cores, MoE dispatch/combine 24, each holding them until its peers arrive).
* ``pytest_npugraph_register_ops``: a custom op the emulator does not ship, with its CPU reference
  math and its profile: an AICPU top-k/top-p sampler (core limits do not bind AICPU ops), and seed
  004's ``early_start_kernel`` (an add that calls ``SetNextTaskStart``: ``set_next_task_start``).
* ``@pytest.mark.pending_kind(KIND)``: an example whose hazard kind has no analysis yet runs as a
  strict xfail until the analysis is registered, then as an ordinary test (nothing to edit).

One file per hazard kind or seed document; each holds the buggy variant (asserting its hazard with
``npugraph.expect``) and the fixed one (asserting clean, with correct numbers).
"""
import pytest
import torch

COLLECTIVE_PROFILES = {
    "reduce_scatter": {"kind": "HCCL", "vector": 16, "all_resident": True},
    "npu_moe_distribute_dispatch": {"kind": "MC2", "vector": 24, "all_resident": True},
    "npu_moe_distribute_combine": {"kind": "MC2", "vector": 24, "all_resident": True},
}


def pytest_npugraph_op_profile(op_name):
    return COLLECTIVE_PROFILES.get(op_name)


def top_k_top_p_sample(logits, k, p):
    """Greedy pick among the top-k tokens whose cumulative probability stays within p."""
    probs = torch.softmax(logits.float(), dim=-1)
    top, idx = probs.topk(k, dim=-1)
    keep = top.cumsum(-1) - top <= p
    return idx.gather(-1, (top * keep).argmax(-1, keepdim=True)).squeeze(-1)


def pytest_npugraph_register_ops(registry):
    registry.register("npu_greedy_top_k_top_p", "npu_greedy_top_k_top_p(Tensor logits, int k, float p) -> Tensor",
                      top_k_top_p_sample, cores={"kind": "AICPU"})
    registry.register("npu_early_start_add", "npu_early_start_add(Tensor src0, Tensor src1) -> Tensor",
                      torch.add, cores={"kind": "AIV", "set_next_task_start": True})


def pytest_configure(config):
    config.addinivalue_line("markers", "pending_kind(KIND): the example's hazard kind has no analysis yet; "
                                       "runs as a strict xfail until it has one")


def analysed(kind: str) -> bool:
    from pytest_npugraph.analysis import REGISTRY

    return any(kinds is None or kind in kinds for kinds, _ in REGISTRY)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for mark in item.iter_markers("pending_kind"):
            if not analysed(mark.args[0]):
                item.add_marker(pytest.mark.xfail(strict=True, reason=f"no {mark.args[0]} analysis yet (issue 6)"))
