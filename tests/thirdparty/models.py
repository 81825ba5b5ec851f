"""Small random Hugging Face causal LMs (2 layers, hidden 64, vocab 128; never any weights downloaded):
the architectures Ascend model code is built from, dense and MoE."""
import torch
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM)

VOCAB = 128
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    # every layer sparse: 4 routed experts, top-2, and the gated shared expert
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64, decoder_sparse_step=1)),
    # MLA attention (q/kv LoRA ranks, split rope/nope heads) and group-limited top-k routing:
    # layer 0 dense, layer 1 MoE with 8 routed experts in 2 groups, 1 shared expert
    "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM,
                    dict(num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
                         num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                         kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16,
                         v_head_dim=16)),
}


def build(name: str, seed: int = 0, **config):
    """The model ``name`` on the CPU in eval mode, with weights from ``seed``."""
    config_cls, model_cls, extra = ARCHITECTURES[name]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**_COMMON, **extra, **config}))
    return model.eval()


def prompt(batch: int = 2, length: int = 8, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)
