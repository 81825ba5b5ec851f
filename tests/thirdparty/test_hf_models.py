"""Hugging Face transformers models run unchanged on the emulated NPU: Llama, Qwen2, Qwen2-MoE and
DeepSeek-V3 built from small random configs give the same logits and the same greedy generations as
on the CPU, eagerly, through transformers' Ascend flash-attention path (``npu_fusion_attention``)
and compiled with the TorchAir backend in GE and reduce-overhead mode."""
import pytest

pytest.importorskip("transformers", reason="test_hf_models needs the test extra: pip install -e '.[test]'")

import torch  # noqa: E402
import torch_npu  # noqa: E402,F401
import torchair  # noqa: E402
from torchair.configs.compiler_config import CompilerConfig  # noqa: E402

from pytest_npugraph import trace as T  # noqa: E402

from .models import ARCHITECTURES, build, prompt  # noqa: E402

MODELS = list(ARCHITECTURES)
MOE = {"qwen2_moe", "deepseek_v3"}
ATOL, RTOL = 1e-5, 1e-4


def _ops(npugraph) -> set:
    return {r.op for r in npugraph.trace.records if isinstance(r, T.Kernel)}


def _cpu_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("name", MODELS)
def test_eager_forward_matches_the_cpu(name, npugraph):
    model, ids = build(name), prompt()
    expected = _cpu_logits(model, ids)
    model.npu()
    assert next(model.parameters()).device.type == "npu"
    with torch.no_grad():
        logits = model(ids.npu()).logits
    assert logits.device.type == "npu"
    torch.testing.assert_close(logits.cpu(), expected, atol=ATOL, rtol=RTOL)
    if name in MOE:
        # transformers' grouped-mm experts count tokens per expert with an int32 histc on any device
        # but cpu/mps: the CPU kernel lacks it, the emulator computes it widened (runtime/cpu_gaps.py)
        assert "aten::histc" in _ops(npugraph)
    npugraph.assert_clean()


@pytest.mark.parametrize("name", MODELS)
def test_greedy_generate_matches_the_cpu(name, npugraph):
    model, ids = build(name), prompt(batch=1, length=6)
    settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(ids, **settings)
        got = model.npu().generate(ids.npu(), **settings)
    assert got.device.type == "npu"
    assert got.cpu().tolist() == expected.tolist()
    npugraph.assert_clean()


@pytest.mark.parametrize("name", MODELS)
def test_the_ascend_flash_attention_path_runs_npu_fusion_attention(name, npugraph):
    """transformers sees torch_npu and routes ``flash_attention_2`` to torch_npu's fused attention."""
    from transformers.utils import is_torch_npu_available

    assert is_torch_npu_available()
    ids = prompt()
    expected = _cpu_logits(build(name), ids)                          # sdpa on the CPU
    model = build(name, attn_implementation="flash_attention_2").npu()
    assert model.config._attn_implementation == "flash_attention_2"
    with torch.no_grad():
        logits = model(ids.npu()).logits
    assert "npu::npu_fusion_attention" in _ops(npugraph)
    torch.testing.assert_close(logits.cpu(), expected, atol=ATOL, rtol=RTOL)
    npugraph.assert_clean()


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
@pytest.mark.parametrize("name", MODELS)
def test_compiled_with_torchair_matches_the_cpu(name, mode, npugraph):
    model, ids = build(name), prompt()
    expected = _cpu_logits(model, ids)
    config = CompilerConfig()
    config.mode = mode
    compiled = torch.compile(model.npu(), backend=torchair.get_npu_backend(compiler_config=config), dynamic=False)
    with torch.no_grad():
        first = compiled(ids.npu()).logits.cpu()
        again = compiled(ids.npu()).logits.cpu()     # GE: the compiled graph; reduce-overhead: a replay
    torch.testing.assert_close(first, expected, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(again, expected, atol=ATOL, rtol=RTOL)
    assert npugraph.graphs and all(g.mode == mode for g in npugraph.graphs)
    npugraph.assert_clean()
