"""The family specs can be registered mechanically: schemas parse, impls accept them, profiles are sane.

Every spec is defined in a throwaway ``npugraph_schema_test`` library (ops renamed with a ``t_``
prefix so nothing clashes with a real or emulated ``npu`` namespace) and called through the
dispatcher, which is how the runtime will call it (list/ScalarType/SymInt[] conversions included).
"""
from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from pytest_npugraph.runtime.ops import registry, spec as op_spec
from pytest_npugraph.runtime.ops.aten import ATEN_CORES, DEFAULT_ATEN_CORES

OPS = [spec for spec in registry.specs() if spec.impl is not None]   # the ops with CPU math
OPS_BY_NAME = {spec.name: spec for spec in OPS}

NAMESPACE = "npugraph_schema_test"
KINDS = {"AICore", "AIV", "AICPU", "ATB", "HCCL", "MC2"}


def _ids(e: int = 4):
    return torch.stack([torch.randperm(e)[:2] for _ in range(3)]).to(torch.int32)


def _mla_example(v3: bool):
    args = (torch.randn(3, 16), torch.randn(16, 12), torch.randn(12, 16), torch.randn(2, 4, 8), torch.randn(16, 12),
            torch.rand(12), torch.rand(8), torch.rand(3, 4), torch.rand(3, 4))
    index, caches = torch.tensor([0, 5, 2]), (torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 4))
    return (args + caches, {"cache_index": index, "query_norm_flag": True}) if v3 else (args + (index,) + caches, {})


# factories of uninitialised memory: their values are undefined, only shapes and dtypes compare
UNINITIALISED = frozenset({"empty_with_format", "unsafe_empty_with_format", "empty_with_swapped_memory"})

# One realistic call per op: (positional args, keyword args).
EXAMPLES = {
    "npu_swiglu": lambda: ((torch.randn(2, 8),), {"dim": -1}),
    "npu_rms_norm": lambda: ((torch.randn(2, 8), torch.ones(8)), {"epsilon": 1e-5}),
    "npu_rms_norm_backward": lambda: ((torch.randn(2, 8), torch.randn(2, 8), torch.rand(8), torch.rand(2, 1)), {}),
    "npu_add_rms_norm": lambda: ((torch.randn(2, 8), torch.randn(2, 8), torch.ones(8)), {}),
    "npu_add_rms_norm_cast": lambda: ((torch.randn(2, 8, dtype=torch.float16), torch.randn(2, 8, dtype=torch.float16),
                                       torch.ones(8, dtype=torch.float16)), {}),
    "npu_add_rms_norm_v2": lambda: ((torch.randn(2, 8), torch.randn(2, 8), torch.rand(8)), {"epsilon": 1e-5}),
    "npu_add_rms_norm_v2_functional": lambda: ((torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.rand(3, 8)), {}),
    "npu_rotary_mul": lambda: ((torch.randn(1, 2, 3, 8), torch.rand(1, 1, 3, 8), torch.rand(1, 1, 3, 8)),
                               {"rotary_mode": "interleave"}),
    "npu_dynamic_quant": lambda: ((torch.randn(4, 16),), {"smooth_scales": torch.rand(2, 16),
                                                          "group_index": torch.tensor([1, 4], dtype=torch.int32),
                                                          "dst_type": torch.int8}),
    "npu_quant_matmul": lambda: ((torch.ones(2, 8, dtype=torch.int8), torch.ones(8, 4, dtype=torch.int8),
                                  torch.rand(4)), {"pertoken_scale": torch.rand(2), "output_dtype": torch.bfloat16}),
    "npu_grouped_matmul": lambda: (([torch.randn(6, 4)], [torch.randn(2, 4, 3)]),
                                   {"bias": [torch.randn(2, 3)], "group_list": torch.tensor([2, 6]), "split_item": 3,
                                    "group_type": 0, "group_list_type": 0}),
    "npu_grouped_matmul.List": lambda: (([torch.randn(5, 4)], [torch.randn(4, 3), torch.randn(4, 3)]),
                                        {"group_list": [2, 5], "split_item": 2, "output_dtype": torch.float32}),
    "npu_moe_gating_top_k_softmax": lambda: ((torch.randn(3, 4), None, 2), {}),
    "npu_moe_gating_top_k": lambda: ((torch.randn(3, 16), 2), {"bias": torch.randn(16), "k_group": 2,
                                                               "group_count": 4, "norm_type": 1}),
    "npu_moe_init_routing": lambda: ((torch.randn(3, 4), torch.tensor([[0, 3], [1, 4], [2, 5]], dtype=torch.int32),
                                      _ids()), {"active_num": 3}),
    "npu_moe_init_routing_v2": lambda: ((torch.randn(3, 4), _ids()), {
        "scale": torch.rand(3), "active_num": 4, "expert_num": 4, "expert_tokens_num_type": 1,
        "expert_tokens_num_flag": True, "active_expert_range": [1, 3], "row_idx_type": 0}),
    "npu_moe_finalize_routing": lambda: ((torch.randn(6, 4), None, None, None, torch.rand(3, 2),
                                          torch.randperm(6).to(torch.int32), _ids()), {"drop_pad_mode": 0, "k": 2}),
    "npu_moe_distribute_dispatch": lambda: ((torch.randn(3, 4), _ids(), "ep", 1, 0, 4),
                                            {"expert_scales": torch.rand(3, 2), "quant_mode": 2}),
    "npu_moe_distribute_combine": lambda: ((torch.randn(6, 4), torch.tensor([[0, 1], [1, 2], [2, 3]], dtype=torch.int32),
                                            torch.zeros(6, dtype=torch.int32), torch.tensor([1, 3, 5, 6],
                                                                                            dtype=torch.int32),
                                            torch.rand(3, 2), "ep", 1, 0, 4), {"shared_expert_x": torch.randn(3, 4)}),
    "npu_fused_infer_attention_score": lambda: ((torch.randn(2, 3, 16), torch.randn(2, 5, 8), torch.randn(2, 5, 8)), {
        "atten_mask": torch.zeros(2, 1, 3, 5, dtype=torch.bool), "actual_seq_lengths": [3, 2],
        "actual_seq_lengths_kv": [5, 4], "num_heads": 4, "num_key_value_heads": 2, "scale": 0.5,
        "input_layout": "BSH", "softmax_lse_flag": True}),
    "npu_fusion_attention": lambda: ((torch.randn(2, 3, 4, 8), torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8),
                                      4, "BSND"), {"atten_mask": torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1),
                                                   "scale": 0.3, "sparse_mode": 3}),
    "npu_fusion_attention_grad": lambda: ((torch.randn(5, 2, 8), torch.randn(6, 1, 8), torch.randn(6, 1, 8),
                                           torch.randn(5, 2, 8), 2, "TND"),
                                          {"scale_value": 0.5, "actual_seq_qlen": [2, 5], "actual_seq_kvlen": [3, 6]}),
    "npu_apply_rotary_pos_emb": lambda: ((torch.randn(2, 3, 4, 8), torch.randn(2, 3, 2, 8), torch.rand(2, 3, 1, 8),
                                          torch.rand(2, 3, 1, 8)), {"layout": "BSND"}),
    "npu_interleave_rope": lambda: ((torch.randn(2, 3, 4, 8), torch.rand(2, 1, 4, 8), torch.rand(2, 1, 4, 8)), {}),
    "npu_kv_rmsnorm_rope_cache": lambda: ((torch.randn(2, 1, 3, 12), torch.rand(8), torch.rand(2, 1, 3, 4),
                                           torch.rand(2, 1, 3, 4), torch.arange(6), torch.zeros(3, 2, 1, 4),
                                           torch.zeros(3, 2, 1, 8)), {"cache_mode": "PA_BNSD", "is_output_kv": True}),
    "npu_kv_rmsnorm_rope_cache_v2": lambda: ((torch.randn(2, 1, 3, 12), torch.rand(8), torch.rand(2, 1, 3, 4),
                                              torch.rand(2, 1, 3, 4), torch.tensor([[0, 1, 2], [3, 4, 5]]),
                                              torch.zeros(2, 1, 6, 4), torch.zeros(2, 1, 6, 8)), {}),
    "npu_kv_rmsnorm_rope_cache_v2_functional": lambda: ((torch.randn(2, 1, 3, 12), torch.rand(8),
                                                         torch.rand(2, 1, 3, 4), torch.rand(2, 1, 3, 4),
                                                         torch.arange(6), torch.zeros(3, 2, 1, 4),
                                                         torch.zeros(3, 2, 1, 8)), {"cache_mode": "PA"}),
    "npu_scatter_nd_update": lambda: ((torch.randn(6, 4), torch.tensor([[4], [1]]), torch.randn(2, 4)), {}),
    "npu_scatter_nd_update_": lambda: ((torch.randn(6, 4), torch.tensor([[4], [1]], dtype=torch.int32),
                                        torch.randn(2, 4)), {}),
    "_npu_reshape_and_cache": lambda: ((torch.randn(3, 2, 4), torch.randn(3, 2, 4), torch.zeros(2, 4, 2, 4),
                                        torch.zeros(2, 4, 2, 4), torch.tensor([0, 5, -1], dtype=torch.int32)), {}),
    "_npu_reshape_and_cache_siso": lambda: ((torch.randn(2, 2, 4), torch.zeros(2, 4, 2, 4),
                                             torch.tensor([7, 1], dtype=torch.int32)), {}),
    "_npu_paged_attention": lambda: ((torch.randn(2, 4, 4), torch.randn(2, 4, 2, 4), torch.randn(2, 4, 2, 4), 2, 4,
                                      0.5, torch.tensor([[0, 1], [1, 0]], dtype=torch.int32),
                                      torch.tensor([5, 3], dtype=torch.int32)), {"out": torch.zeros(2, 4, 4)}),
    "scatter_update": lambda: ((torch.zeros(2, 2, 6, 4), torch.tensor([1, 3]), torch.randn(2, 2, 2, 4), -2), {}),
    "scatter_update_": lambda: ((torch.zeros(2, 2, 6, 4), torch.tensor([0, 4], dtype=torch.int32),
                                 torch.randn(2, 2, 2, 4), 2), {}),
    "npu_mrope": lambda: ((torch.tensor([[0, 1, 2], [0, 2, 4], [1, 1, 3]]), torch.randn(3, 16), torch.randn(3, 8),
                           torch.randn(8, 6), 8), {"mrope_section": [1, 1, 1]}),
    "npu_rotary_mul_backward": lambda: ((torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.rand(1, 1, 3, 8),
                                         torch.rand(1, 1, 3, 8)), {}),
    "npu_scatter_pa_kv_cache": lambda: ((torch.randn(3, 2, 4), torch.randn(3, 2, 4), torch.zeros(2, 4, 2, 4),
                                         torch.zeros(2, 4, 2, 4), torch.tensor([0, 5, -1], dtype=torch.int32)),
                                        {"cache_mode": "Norm"}),
    "npu_scatter_pa_kv_cache_functional": lambda: ((torch.randn(3, 2, 4), torch.randn(3, 2, 4),
                                                    torch.zeros(2, 2, 4, 4), torch.zeros(2, 2, 4, 4),
                                                    torch.tensor([0, 5, -1], dtype=torch.int32)), {}),
    "npu_top_k_top_p": lambda: ((torch.randn(3, 8), torch.rand(3), torch.tensor([1, 4, 8], dtype=torch.int32)), {}),
    "npu_mla_prolog_v2": lambda: _mla_example(v3=False),
    "npu_mla_prolog_v3": lambda: _mla_example(v3=True),
    "npu_mla_prolog_v3_functional": lambda: _mla_example(v3=True),
    "npu_fused_infer_attention_score.out": lambda: ((torch.randn(1, 2, 1, 8), torch.randn(1, 2, 3, 8),
                                                     torch.randn(1, 2, 3, 8)),
                                                    {"num_heads": 2, "input_layout": "BNSD", "softmax_lse_flag": True,
                                                     "workspace": torch.empty(64, dtype=torch.uint8),
                                                     "attention_out": torch.zeros(1, 2, 1, 8),
                                                     "softmax_lse": torch.zeros(1, 2, 1, 1)}),
    "_npu_fused_infer_attention_score_get_max_workspace": lambda: ((torch.randn(1, 2, 1, 8), torch.randn(1, 2, 3, 8),
                                                                    torch.randn(1, 2, 3, 8)),
                                                                   {"num_heads": 2, "input_layout": "BNSD"}),
    "_npu_fused_infer_attention_score_infer_output": lambda: ((torch.randn(2, 3, 16), torch.randn(2, 5, 8)),
                                                              {"num_heads": 4, "num_key_value_heads": 2,
                                                               "softmax_lse_flag": True}),
    "npu_fused_infer_attention_score_v2": lambda: ((torch.randn(5, 2, 4), torch.randn(5, 2, 4), torch.randn(5, 2, 4)),
                                                   {"num_query_heads": 2, "input_layout": "TND",
                                                    "actual_seq_qlen": [2, 5], "actual_seq_kvlen": [2, 5],
                                                    "learnable_sink": torch.tensor([0.5, -0.5]),
                                                    "return_softmax_lse": True}),
    "npu_fused_infer_attention_score_v2.out": lambda: ((torch.randn(1, 2, 1, 8), torch.randn(1, 2, 3, 8),
                                                        torch.randn(1, 2, 3, 8)),
                                                       {"num_query_heads": 2, "input_layout": "BNSD",
                                                        "attention_out": torch.zeros(1, 2, 1, 8),
                                                        "softmax_lse": torch.zeros(1)}),
    "_npu_fused_infer_attention_score_v2_get_max_workspace": lambda: ((torch.randn(1, 2, 1, 8),
                                                                       torch.randn(1, 2, 3, 8),
                                                                       torch.randn(1, 2, 3, 8)),
                                                                      {"num_query_heads": 2, "input_layout": "BNSD"}),
    "_npu_fused_infer_attention_score_v2_infer_output": lambda: ((torch.randn(5, 2, 4), torch.randn(5, 2, 4)),
                                                                 {"num_query_heads": 2, "input_layout": "TND",
                                                                  "return_softmax_lse": True}),
    "npu_prompt_flash_attention": lambda: ((torch.randn(2, 4, 16), torch.randn(2, 4, 8), torch.randn(2, 4, 8)),
                                           {"atten_mask": torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1),
                                            "num_heads": 4, "num_key_value_heads": 2, "sparse_mode": 3}),
    "npu_incre_flash_attention": lambda: ((torch.randn(2, 1, 16), torch.randn(2, 5, 8), torch.randn(2, 5, 8)),
                                          {"actual_seq_lengths": [5, 2], "num_heads": 4, "num_key_value_heads": 2}),
    "npu_prefetch": lambda: ((torch.randn(4), None, 64), {"offset": 0}),
    "npu_format_cast": lambda: ((torch.randn(2, 3, 4, 5), 29), {}),
    "empty_with_format": lambda: (([16, 17],), {"dtype": torch.float16, "acl_format": 29}),
    "unsafe_empty_with_format": lambda: (([3, 4],), {"dtype": torch.float32, "acl_format": 2, "keep_format": True}),
    "empty_with_swapped_memory": lambda: (([5],), {"dtype": torch.int32}),
    "npu_format_cast.Tensor": lambda: ((torch.randn(2, 3), torch.randn(2, 3)), {}),
    "npu_format_cast_": lambda: ((torch.randn(2, 3), torch.randn(2, 3)), {}),
    "npu_format_cast_.acl_format": lambda: ((torch.randn(2, 3), 2), {}),
    # norms + quant variants, quantisation, MoE routing, MC2 (single rank): tests/ops/test_quant_moe_specs.py
    "npu_add_rms_norm_quant": lambda: ((torch.randn(2, 8), torch.randn(2, 8), torch.ones(8), torch.rand(8) + 0.1,
                                        torch.zeros(8, dtype=torch.int32)), {"epsilon": 1e-5, "dst_type": torch.int8}),
    "npu_add_rms_norm_dynamic_quant": lambda: ((torch.randn(2, 16), torch.randn(2, 16), torch.ones(16)),
                                               {"smooth_scale1": torch.rand(16), "output_mask": [True, False],
                                                "y_dtype": torch.quint4x2}),
    "npu_add_layer_norm": lambda: ((torch.randn(2, 8), torch.randn(2, 8), torch.ones(8), torch.zeros(8)), {}),
    "npu_quantize": lambda: ((torch.randn(2, 16), torch.rand(16) + 0.1, None, torch.quint4x2, -1, False), {}),
    "npu_anti_quant": lambda: ((torch.randint(-5, 5, (2, 8), dtype=torch.int8), torch.rand(8)),
                               {"dst_dtype": torch.bfloat16}),
    "npu_dynamic_quant_asymmetric": lambda: ((torch.randn(4, 16),), {"smooth_scales": torch.rand(2, 16),
                                                                     "group_index": torch.tensor([1, 4],
                                                                                                 dtype=torch.int32)}),
    "npu_weight_quant_batchmatmul": lambda: ((torch.randn(3, 8), torch.randint(-8, 8, (8, 4), dtype=torch.int8),
                                              torch.rand(4)), {"quant_scale": torch.rand(4)}),
    "npu_dequant_swiglu_quant": lambda: ((torch.randint(-20, 20, (4, 8), dtype=torch.int32),), {
        "weight_scale": torch.rand(8), "activation_scale": torch.rand(4), "quant_mode": 1, "activate_left": True}),
    "npu_moe_compute_expert_tokens": lambda: ((torch.tensor([0, 0, 1, 3], dtype=torch.int32), 4), {}),
    "npu_moe_token_permute": lambda: ((torch.randn(3, 4), _ids().to(torch.int64)), {"num_out_tokens": 5}),
    "npu_moe_token_unpermute": lambda: ((torch.randn(6, 4), torch.randperm(6).to(torch.int32)),
                                        {"probs": torch.rand(3, 2)}),
    "npu_grouped_matmul_finalize_routing": lambda: ((torch.randint(-5, 5, (4, 8), dtype=torch.int8),
                                                     torch.randint(-5, 5, (2, 8, 3), dtype=torch.int8),
                                                     torch.tensor([2, 2])), {
        "scale": torch.rand(2, 3), "logit": torch.rand(4), "row_index": torch.tensor([1, 0, 1, 0]), "output_bs": 2,
        "dtype": torch.float32}),
    "npu_moe_distribute_dispatch_v2": lambda: ((torch.randn(3, 4), _ids(), "ep", 1, 0, 4),
                                               {"expert_scales": torch.rand(3, 2), "comm_alg": "fullmesh_v2"}),
    "npu_moe_distribute_combine_v2": lambda: ((torch.randn(6, 4), torch.tensor([[0, 1], [1, 2], [2, 3]],
                                                                               dtype=torch.int32),
                                               torch.zeros(768, dtype=torch.int32),
                                               torch.tensor([1, 3, 5, 6], dtype=torch.int32), torch.rand(3, 2),
                                               "ep", 1, 0, 4), {}),
    "npu_mm_all_reduce_base": lambda: ((torch.randint(-5, 5, (2, 8), dtype=torch.int8),
                                        torch.randint(-5, 5, (8, 4), dtype=torch.int8), "tp"),
                                       {"dequant_scale": torch.rand(4), "pertoken_scale": torch.rand(2),
                                        "y_dtype": torch.bfloat16}),
    "npu_all_gather_base_mm": lambda: ((torch.randn(2, 8), torch.randn(8, 4), "tp", 1), {"gather_output": False}),
    "npu_mm_reduce_scatter_base": lambda: ((torch.randn(4, 8), torch.randn(8, 3), "tp", 1),
                                           {"output_dtype": torch.float16}),
    "npu_fast_gelu": lambda: ((torch.randn(2, 8, dtype=torch.bfloat16),), {}),
    "fast_gelu": lambda: ((torch.randn(2, 8),), {}),
    "npu_fast_gelu_backward": lambda: ((torch.randn(2, 8), torch.randn(2, 8)), {}),
    "npu_gather_pa_kv_cache": lambda: ((torch.randn(3, 4, 1, 8), torch.randn(3, 4, 1, 2),
                                        torch.tensor([[2, 0], [1, 2]], dtype=torch.int32),
                                        torch.tensor([5, 2], dtype=torch.int32), torch.zeros(7, 1, 8),
                                        torch.zeros(7, 1, 2)), {"seq_offset": torch.tensor([0, 4], dtype=torch.int32)}),
    "npu_gather_pa_kv_cache_functional": lambda: ((torch.randn(3, 4, 1, 8), torch.randn(3, 4, 1, 2),
                                                   torch.tensor([[2, 0], [1, 2]], dtype=torch.int32),
                                                   torch.tensor([0, 5, 7], dtype=torch.int32), torch.zeros(7, 1, 8),
                                                   torch.zeros(7, 1, 2)), {"is_seq_lens_cumsum": True}),
    "npu_attention_update": lambda: (([torch.randn(4), torch.randn(4)], [torch.randn(4, 8), torch.randn(4, 8)], 1), {}),
    "npu_kronecker_quant": lambda: ((torch.randn(3, 2, 8, dtype=torch.float16), torch.randn(2, 2, dtype=torch.float16),
                                     torch.randn(8, 8, dtype=torch.float16), 0.9, 3), {}),
    "npu_convert_weight_to_int4pack": lambda: ((torch.randint(-8, 8, (4, 16), dtype=torch.int32),), {"inner_k_tiles": 1}),
    "npu_dynamic_mx_quant": lambda: ((torch.randn(2, 96, dtype=torch.bfloat16),), {"axis": -1, "dst_type": 24,
                                                                                  "block_size": 32, "scale_alg": 1}),
    "npu_transpose_batchmatmul": lambda: ((torch.randn(3, 2, 8, dtype=torch.float16),
                                           torch.randn(2, 8, 4, dtype=torch.float16)),
                                          {"perm_x1": [1, 0, 2], "perm_y": [1, 0, 2]}),
    "npu_transpose_quant_batchmatmul": lambda: ((torch.randint(-5, 5, (3, 2, 8), dtype=torch.int8),
                                                 torch.randint(-5, 5, (2, 8, 4), dtype=torch.int8), 15),
                                                {"x1_scale": torch.rand(3), "x2_scale": torch.rand(4),
                                                 "perm_x1": [1, 0, 2], "perm_y": [1, 0, 2]}),
    "_npu_matmul_add_fp32": lambda: ((torch.randn(2, 4, dtype=torch.float16), torch.randn(2, 3, dtype=torch.float16),
                                      torch.randn(4, 3)), {}),
    "_npu_rotary_embedding": lambda: ((torch.tensor([0, 3, 1]), torch.randn(3, 16), torch.randn(3, 8), 8,
                                       torch.randn(5, 8), True), {}),
    "npu_lightning_indexer": lambda: ((torch.randn(4, 4, 8, dtype=torch.float16), torch.randn(3, 2, 1, 8,
                                                                                              dtype=torch.float16),
                                       torch.randn(4, 4, dtype=torch.float16)),
                                      {"actual_seq_lengths_query": torch.tensor([1, 4], dtype=torch.int32),
                                       "actual_seq_lengths_key": torch.tensor([3, 4], dtype=torch.int32),
                                       "block_table": torch.tensor([[2, 0], [1, 0]], dtype=torch.int32),
                                       "layout_query": "TND", "layout_key": "PA_BSND", "sparse_count": 3,
                                       "return_value": True}),
    "npu_quant_lightning_indexer": lambda: ((torch.randint(-9, 9, (1, 3, 2, 8), dtype=torch.int8),
                                             torch.randint(-9, 9, (1, 4, 1, 8), dtype=torch.int8),
                                             torch.randn(1, 3, 2, dtype=torch.float16),
                                             torch.rand(1, 3, 2, dtype=torch.float16),
                                             torch.rand(1, 4, 1, dtype=torch.float16), 0, 0), {"sparse_count": 2}),
    "npu_grouped_matmul_swiglu_quant": lambda: ((torch.randint(-9, 9, (5, 8), dtype=torch.int8),
                                                 torch.randint(-9, 9, (2, 8, 6), dtype=torch.int8),
                                                 torch.tensor([2, 5]), torch.rand(2, 6), torch.rand(5)), {}),
    "npu_grouped_matmul_swiglu_quant_v2": lambda: ((torch.randint(-9, 9, (5, 8), dtype=torch.int8),
                                                    [torch.randint(-9, 9, (2, 8, 6), dtype=torch.int8)],
                                                    [torch.rand(2, 6)], torch.rand(5), torch.tensor([2, 3])),
                                                   {"group_list_type": 1}),
    "npu_quant_grouped_matmul_dequant": lambda: ((torch.randn(5, 8, dtype=torch.float16),
                                                  torch.randint(-9, 9, (2, 6, 8), dtype=torch.int8), torch.rand(2, 6),
                                                  torch.tensor([2, 5])), {"quant_mode": "pertoken"}),
    "_npu_paged_attention_get_workspace": lambda: ((torch.randn(2, 4, 8), torch.randn(3, 4, 2, 8),
                                                    torch.randn(3, 4, 2, 8), 2, 4, 0.3,
                                                    torch.tensor([[0, 1], [2, 0]], dtype=torch.int32),
                                                    torch.tensor([5, 3], dtype=torch.int32), torch.zeros(2, 4, 8)), {}),
    "npu_paged_cache_load.out": lambda: ((torch.randn(3, 4, 1, 8), torch.randn(3, 4, 1, 2),
                                          torch.tensor([[2, 0], [1, 2]], dtype=torch.int32),
                                          torch.tensor([5, 2], dtype=torch.int32)),
                                         {"seq_starts": torch.tensor([0, 3], dtype=torch.int32),
                                          "key": torch.zeros(7, 1, 8), "value": torch.zeros(7, 1, 2)}),
    "_npu_flash_attention_unpad": lambda: ((torch.randn(5, 4, 8, dtype=torch.float16),
                                            torch.randn(5, 2, 8, dtype=torch.float16),
                                            torch.randn(5, 2, 8, dtype=torch.float16), torch.tensor([2, 3]), 0.35, 4, 2,
                                            torch.zeros(5, 4, 8, dtype=torch.float16)), {}),
    "_npu_flash_attention_unpad_v2": lambda: ((torch.randn(5, 4, 8, dtype=torch.bfloat16),
                                               torch.randn(5, 4, 8, dtype=torch.bfloat16),
                                               torch.randn(5, 4, 8, dtype=torch.bfloat16), torch.tensor([5]), 0.35, 4,
                                               4), {"kernel_type": 1, "out": torch.zeros(5, 4, 8, dtype=torch.bfloat16)}),
    "_npu_flash_attention": lambda: ((torch.randn(5, 4, 8, dtype=torch.float16),
                                      torch.randn(5, 4, 8, dtype=torch.float16),
                                      torch.randn(5, 4, 8, dtype=torch.float16),
                                      torch.triu(torch.full((4, 4), -10000.0, dtype=torch.float16), 1),
                                      torch.tensor([2, 3]), 0.35, 4, 4, torch.zeros(5, 4, 8, dtype=torch.float16)), {}),
    "npu_rms_norm_dynamic_mx_quant": lambda: ((torch.randn(3, 64, dtype=torch.bfloat16), torch.rand(64,
                                                                                                dtype=torch.bfloat16)),
                                              {"dst_type": 24}),
    "npu_dynamic_block_quant": lambda: ((torch.randn(3, 130, dtype=torch.float16),), {"col_block_size": 128}),
    "npu_sign_bits_pack": lambda: ((torch.randn(20),), {"size": 3}),
    "npu_sign_bits_unpack": lambda: ((torch.randint(0, 256, (4,), dtype=torch.uint8), 2, torch.float16), {}),
    "npu_add_rms_norm_dynamic_mx_quant": lambda: ((torch.randn(3, 64, dtype=torch.float16),
                                                   torch.randn(3, 64, dtype=torch.float16),
                                                   torch.rand(64, dtype=torch.float16)), {}),
}


def _renamed(spec) -> str:
    return "t_" + spec.name


@pytest.fixture(scope="module")
def library():
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    for spec in OPS:
        lib.define("t_" + spec.schema)
        # a factory (no tensor argument) has no backend to dispatch on: its kernel is the composite one
        lib.impl(_renamed(spec), spec.impl, "CompositeExplicitAutograd" if spec.name in UNINITIALISED else "CPU")
    yield lib
    lib._destroy()


def _overload(spec):
    base, _, overload = _renamed(spec).partition(".")
    return getattr(getattr(torch.ops, NAMESPACE), base).__getattr__(overload or "default")


def test_names_are_unique_and_taken_from_the_schema():
    assert len(OPS_BY_NAME) == len(OPS)
    for spec in OPS:
        assert spec.schema.startswith(spec.name + "(")


def test_the_required_ops_are_all_there():
    required = {"npu_swiglu", "npu_rms_norm", "npu_add_rms_norm", "npu_add_rms_norm_v2",
                "npu_add_rms_norm_v2_functional", "npu_rotary_mul", "npu_dynamic_quant",
                "npu_quant_matmul", "npu_grouped_matmul", "npu_grouped_matmul.List", "npu_moe_gating_top_k_softmax",
                "npu_moe_gating_top_k", "npu_moe_init_routing", "npu_moe_init_routing_v2", "npu_moe_finalize_routing",
                "npu_fused_infer_attention_score", "npu_prefetch", "npu_format_cast", "npu_moe_distribute_dispatch",
                "npu_moe_distribute_combine"}
    assert required <= set(OPS_BY_NAME)
    assert set(EXAMPLES) == set(OPS_BY_NAME)


def _same_default(python_default, schema_default) -> bool:
    if isinstance(python_default, (list, tuple)) or isinstance(schema_default, (list, tuple)):
        return list(python_default) == list(schema_default)
    if isinstance(schema_default, float):
        return python_default == pytest.approx(schema_default)
    return python_default == schema_default


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_schema_parses_and_impl_signature_accepts_it(library, spec):
    schema = _overload(spec)._schema
    params = inspect.signature(spec.impl).parameters
    arg_names = [a.name for a in schema.arguments]
    assert list(params) == arg_names, "impl parameters must be the schema arguments, in order"
    for arg in schema.arguments:
        param = params[arg.name]
        expected_kind = inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert param.kind == expected_kind, arg.name
        if arg.has_default_value():
            assert param.default is not inspect.Parameter.empty, arg.name
            assert _same_default(param.default, arg.default_value), (arg.name, param.default, arg.default_value)
        else:
            assert param.default is inspect.Parameter.empty, arg.name


def _shapes(out):
    leaves, _ = tree_flatten(out)
    return [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t for t in leaves]


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_dispatcher_call_matches_direct_call(library, spec):
    torch.manual_seed(0)
    args, kwargs = EXAMPLES[spec.name]()
    clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731  (ops may write their inputs)
    direct_args, direct_kwargs = tree_map(clone, args), tree_map(clone, kwargs)
    through_dispatcher = _overload(spec)(*args, **kwargs)
    direct = spec.impl(*direct_args, **direct_kwargs)
    assert _shapes(through_dispatcher) == _shapes(direct)
    for a, b in zip(tree_flatten(through_dispatcher)[0], tree_flatten(direct)[0]):
        if isinstance(a, torch.Tensor) and spec.name not in UNINITIALISED:
            torch.testing.assert_close(a, b)
    for a, b in zip(tree_flatten((args, kwargs))[0], tree_flatten((direct_args, direct_kwargs))[0]):
        if isinstance(a, torch.Tensor):   # written arguments end up the same both ways
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_all_zero_inputs_give_the_same_shapes(spec):
    """The runtime's Meta kernel runs the reference on zeros of the input shapes: it must not fail."""
    torch.manual_seed(0)
    args, kwargs = EXAMPLES[spec.name]()
    zeros = lambda t: torch.zeros(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else t  # noqa: E731
    expected = _shapes(spec.impl(*args, **kwargs))
    assert _shapes(spec.impl(*tree_map(zeros, args), **tree_map(zeros, kwargs))) == expected


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_core_profiles_are_declarative_and_complete(spec):
    profile = spec.cores
    assert set(profile) == {"kind", "cube", "vector", "all_resident", "limit_applies"}
    assert profile["kind"] in KINDS
    for key in ("cube", "vector"):
        assert profile[key] == "all" or (isinstance(profile[key], int) and profile[key] >= 0)
    if profile["kind"] == "MC2":
        assert profile["all_resident"] is True and profile["vector"] == "all"


def test_profiles_are_not_shared_between_ops():
    assert len({id(spec.cores) for spec in OPS}) == len(OPS)


def test_aten_profiles():
    assert ATEN_CORES["nonzero"]["all_resident"] is True and ATEN_CORES["nonzero"]["kind"] == "AIV"
    for name in ("mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "convolution"):
        assert ATEN_CORES[name]["kind"] == "AICore" and ATEN_CORES[name]["cube"] == "all"
        assert not ATEN_CORES[name]["all_resident"]
    assert DEFAULT_ATEN_CORES["kind"] == "AIV" and DEFAULT_ATEN_CORES["vector"] == "all"
    assert op_spec.cores("AICPU", limit_applies=False)["limit_applies"] is False
