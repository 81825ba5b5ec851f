"""vLLM-Ascend's own layer classes on the emulated NPU: values against plain torch, no hazard.

Needs vllm 0.23.0 and vLLM-Ascend 0.23.0's sources importable (``tools/vllm_ascend/setup.sh VENV SRC``, then
``export PYTHONPATH=SRC``); skipped otherwise.  The same patterns without vLLM run always:
``test_vllm_ascend_patterns.py``.

Cases marked ``npu_key_kernels`` call the custom ops vLLM-Ascend registers for the ``PrivateUse1`` key
(``torch.ops.vllm.maybe_chunk_residual``, ``torch.ops.vllm.npu_rotary_embedding``): they are skipped until
the emulator runs kernels registered for the NPU key with NPU tensors.
"""
from __future__ import annotations

import pytest
import torch

vllm_ascend = pytest.importorskip("vllm_ascend", reason="vLLM-Ascend's sources are not importable: run "
                                                         "tools/vllm_ascend/setup.sh and export PYTHONPATH")
pytest.importorskip("vllm", reason="vllm 0.23.0 is not installed: run tools/vllm_ascend/setup.sh")

import torch_npu  # noqa: E402,F401
import vllm.platforms  # noqa: E402

if vllm.platforms._current_platform is None:      # what vLLM's platform plugin (vllm_ascend:register) selects
    from vllm_ascend.platform import NPUPlatform

    vllm.platforms._current_platform = NPUPlatform()

from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402

import vllm_ascend.utils as va_utils  # noqa: E402
from vllm_ascend.ops import register_custom_ops  # noqa: E402,F401  (registers torch.ops.vllm.* for PrivateUse1)

from . import reference as R  # noqa: E402

ATOL = RTOL = 1e-5


def _npu_key_kernels_run() -> bool:
    """Whether an op with only a PrivateUse1 kernel runs on emulated NPU tensors."""
    name = "npugraph_probe_npu_key"
    lib = torch.library.Library(name, "FRAGMENT")
    try:
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "PrivateUse1")
        return torch.equal(getattr(torch.ops, name).twice(torch.ones(2, device="npu")).cpu(), torch.full((2,), 2.0))
    except (NotImplementedError, RuntimeError):
        return False
    finally:
        lib._destroy()


@pytest.fixture
def npu_key_kernels(npugraph):
    if not _npu_key_kernels_run():
        pytest.skip("needs kernels registered for the NPU key to run with NPU tensors (issue 23, item 1)")


@pytest.fixture(autouse=True)
def vllm_config(monkeypatch):
    """A default VllmConfig (no model), vLLM-Ascend's weight-prefetch method off, custom C++ ops off."""
    from vllm_ascend.ascend_config import WeightPrefetchConfig

    monkeypatch.setattr(va_utils, "_IS_MOE_MODEL", False)
    monkeypatch.setattr(va_utils, "_CUSTOM_OP_ENABLED", False)     # vllm_ascend_C is a CANN build product
    monkeypatch.setattr(va_utils, "_WEIGHT_PREFETCH_METHOD", None)
    with set_current_vllm_config(VllmConfig()):
        va_utils.set_weight_prefetch_method(WeightPrefetchConfig({}))
        yield


def _rms_norm(hidden, dtype=torch.float16):
    from vllm_ascend.ops.layernorm import AscendRMSNorm

    layer = AscendRMSNorm(hidden, eps=1e-6, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(hidden, dtype=dtype) + 0.5)
    return layer


def test_rms_norm_without_residual(npugraph):
    layer = _rms_norm(64)
    x = torch.randn(5, 64, dtype=torch.float16)
    want = R.rms_norm(x, layer.weight.data, 1e-6)
    layer.npu()
    out = layer.forward_oot(x.npu())
    assert out.device.type == "npu"
    torch.testing.assert_close(out.cpu().float(), want.float(), atol=2e-3, rtol=2e-3)
    npugraph.assert_clean()


def test_rms_norm_with_residual(npugraph, npu_key_kernels):
    layer = _rms_norm(64)
    x, residual = torch.randn(5, 64, dtype=torch.float16), torch.randn(5, 64, dtype=torch.float16)
    want, want_residual = R.add_rms_norm(x, residual, layer.weight.data, 1e-6)
    layer.npu()
    out, new_residual = layer.forward_oot(x.npu(), residual.npu())
    torch.testing.assert_close(out.cpu().float(), want.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(new_residual.cpu(), want_residual)
    npugraph.assert_clean()


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rope_forward_oot_the_default_path_without_triton(npugraph, neox, rotary_dim):
    """``rope_forward_oot``: ``_npu_rotary_embedding`` on the whole head, or on its first rotary_dim values."""
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    from vllm_ascend.ops import rotary_embedding as rope

    assert not rope.HAS_TRITON, "triton is installed: vLLM-Ascend then takes its triton-ascend kernels"
    head, heads, kv_heads, tokens = 32, 4, 2, 6
    cache = RotaryEmbedding(head, rotary_dim, 64, 10000.0, neox, torch.float32).cos_sin_cache
    positions = torch.tensor([0, 5, 9, 2, 63, 7])
    q, k = torch.randn(tokens, heads * head), torch.randn(tokens, kv_heads * head)
    want_q, want_k = R.rope(positions, q, head, cache, neox), R.rope(positions, k, head, cache, neox)
    got_q, got_k = rope.rope_forward_oot(positions.npu(), q.npu(), k.npu(), cache.npu(), head, rotary_dim, neox)
    torch.testing.assert_close(got_q.cpu(), want_q, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got_k.cpu(), want_k, atol=ATOL, rtol=RTOL)
    npugraph.assert_clean()


def test_rotary_embedding_layer(npugraph, npu_key_kernels):
    from vllm_ascend.ops.rotary_embedding import AscendRotaryEmbedding

    layer = AscendRotaryEmbedding(32, 32, 64, 10000.0, True, torch.float32)
    positions = torch.tensor([3, 1, 4])
    q, k = torch.randn(3, 4 * 32), torch.randn(3, 2 * 32)
    want_q, want_k = R.rope(positions, q, 32, layer.cos_sin_cache, True), R.rope(positions, k, 32,
                                                                                  layer.cos_sin_cache, True)
    layer.npu()
    from vllm.config import get_current_vllm_config
    from vllm.forward_context import set_forward_context

    with set_forward_context(None, get_current_vllm_config(), num_tokens=3):   # a single-rank step
        got_q, got_k = layer.forward_oot(positions.npu(), q.npu(), k.npu())
    torch.testing.assert_close(got_q.cpu(), want_q, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got_k.cpu(), want_k, atol=ATOL, rtol=RTOL)
    npugraph.assert_clean()


def test_silu_and_mul(npugraph):
    from vllm_ascend.ops.activation import AscendSiluAndMul

    x = torch.randn(4, 2 * 48, dtype=torch.bfloat16)
    out = AscendSiluAndMul().forward_oot(x.npu())
    torch.testing.assert_close(out.cpu().float(), R.silu_and_mul(x).float(), atol=1e-2, rtol=1e-2)
    npugraph.assert_clean()


def test_fused_moe_allgather_path(npugraph, monkeypatch):
    """select_experts (npu_moe_gating_top_k) -> TokenDispatcherWithAllGather (npu_moe_init_routing_v2) ->
    unquant_apply_mlp (npu_grouped_matmul, npu_swiglu) -> token_combine (npu_moe_token_unpermute).

    The stages take vLLM-Ascend's A5 device adaptor (``torch_npu.npu_moe_gating_top_k``,
    ``npu_moe_init_routing_v2``): on A2/A3 they call its own kernels ``torch.ops._C_ascend.moe_gating_top_k`` and
    ``npu_moe_init_routing_custom`` from vllm_ascend_C, a CANN build product."""
    from vllm_ascend.device.device_op import A5DeviceAdaptor
    from vllm_ascend.ops.fused_moe import experts_selector
    from vllm_ascend.ops.fused_moe.experts_selector import select_experts
    from vllm_ascend.ops.fused_moe.moe_mlp import unquant_apply_mlp
    from vllm_ascend.ops.fused_moe.moe_stage_contracts import MoETokenDispatchInput
    from vllm_ascend.ops.fused_moe.moe_stage_params import MoEQuantParams, MoERoutingParams
    from vllm_ascend.ops.fused_moe import token_dispatcher
    from vllm_ascend.ops.fused_moe.token_dispatcher import TokenDispatcherWithAllGather

    tokens, hidden, inter, experts, top_k = 6, 16, 8, 4, 2
    x = torch.randn(tokens, hidden)
    logits = torch.randn(tokens, experts)
    w1, w2 = torch.randn(experts, 2 * inter, hidden) * 0.2, torch.randn(experts, hidden, inter) * 0.2
    want = R.moe(x, logits, w1, w2, top_k)

    monkeypatch.setattr(experts_selector, "DeviceOperator", A5DeviceAdaptor)
    monkeypatch.setattr(token_dispatcher, "DeviceOperator", A5DeviceAdaptor)
    xn = x.npu()
    weights, ids = select_experts(hidden_states=xn, router_logits=logits.npu(), top_k=top_k, use_grouped_topk=False,
                                  renormalize=True)
    dispatcher = TokenDispatcherWithAllGather(top_k=top_k, num_experts=experts, num_local_experts=experts)
    routing = MoERoutingParams(expert_map=None, global_redundant_expert_num=0, mc2_mask=None,
                               apply_router_weight_on_input=False)
    out = dispatcher.token_dispatch(MoETokenDispatchInput(hidden_states=xn, topk_weights=weights, topk_ids=ids,
                                                          routing=routing, quant=MoEQuantParams()))
    expert_out, _ = unquant_apply_mlp(out.hidden_states, w1.npu(), w2.npu(), out.group_list,
                                      group_list_type=out.group_list_type)
    final = dispatcher.token_combine(expert_out, out.combine_metadata)
    torch.testing.assert_close(final.cpu(), want, atol=1e-4, rtol=1e-4)
    from pytest_npugraph.trace import Kernel

    ops = {r.op.split("::")[-1].split(".")[0] for r in npugraph.trace.records if type(r) is Kernel}
    assert {"npu_moe_gating_top_k", "npu_moe_init_routing_v2", "npu_grouped_matmul", "npu_swiglu",
            "npu_moe_token_unpermute"} <= ops, ops
    npugraph.assert_clean()


def test_acl_graph_decode_step(npugraph):
    """A decode step of the layers above captured as an ACL graph (``torch.npu.NPUGraph``, as vLLM-Ascend's
    ACLGraphWrapper does) and replayed on new inputs copied into the static buffers."""
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    from vllm_ascend.ops.activation import AscendSiluAndMul
    from vllm_ascend.ops.rotary_embedding import rope_forward_oot

    norm = _rms_norm(32, torch.float32).npu()
    gate_up = torch.randn(32, 64) * 0.2
    cache = RotaryEmbedding(16, 16, 32, 10000.0, True, torch.float32).cos_sin_cache
    act = AscendSiluAndMul()

    def step(x, positions):
        h = norm.forward_oot(x)
        q, k = rope_forward_oot(positions, h, h[:, :16].contiguous(), cache_npu, 16, 16, True)
        return act.forward_oot(q @ gate_up_npu), k

    def reference(x, positions):
        h = R.rms_norm(x, norm.weight.data.cpu(), 1e-6)
        q, k = R.rope(positions, h, 16, cache, True), R.rope(positions, h[:, :16], 16, cache, True)
        return R.silu_and_mul(q @ gate_up), k

    cache_npu, gate_up_npu = cache.npu(), gate_up.npu()
    static_x, static_pos = torch.zeros(4, 32).npu(), torch.zeros(4, dtype=torch.int64).npu()
    stream = torch.npu.Stream()
    stream.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(stream):
        step(static_x, static_pos)                         # warm-up on a side stream, as vLLM does
    torch.npu.current_stream().wait_stream(stream)
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        static_out, static_k = step(static_x, static_pos)
    for _ in range(2):
        x, positions = torch.randn(4, 32), torch.randint(0, 32, (4,))
        static_x.copy_(x.npu())
        static_pos.copy_(positions.npu())
        graph.replay()
        want_out, want_k = reference(x, positions)
        torch.testing.assert_close(static_out.cpu(), want_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(static_k.cpu(), want_k, atol=1e-5, rtol=1e-5)
    npugraph.assert_clean()
