"""The torch_npu custom ops the emulator provides: schema, CPU reference and device profile.

``OPS`` is what the runtime registers (``Library("npu", "DEF").define(spec.schema)`` and an
implementation wrapping ``spec.impl``).  Schema strings are copied verbatim from torch_npu
2.14.0's ``npu_native_functions_by_codegen.yaml`` so argument names, defaults and overloads
match what model code calls.

``cores`` is a small declarative device profile (``runtime.profiles.to_cores`` resolves it
against a device into ``trace.OpCores``):

* ``kind``: "AICore" (cube or mixed cube+vector kernels), "AIV" (vector only), "AICPU", "ATB",
  "HCCL", "MC2" (fused compute + communication);
* ``cube`` / ``vector``: blocks demanded on each core type: ``"all"`` (one block per core of
  the device, what an Ascend C kernel launches by default) or a fixed int; 0 = none;
* ``all_resident``: every block must hold a core at the same time (full-core sync such as
  NonZero or the MC2 all-to-all), the source of core-occupation deadlocks;
* ``limit_applies``: whether stream/op core limits take effect (Ascend C ops yes; AICPU, ATB,
  TBE kernels and cache-maintenance tasks no).

``ATEN_CORES`` profiles the aten ops that matter for core analysis, keyed by the op's base
name ("nonzero" for ``aten::nonzero.out``); any other aten op is ``DEFAULT_ATEN_CORES``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from . import reference as ref

CoreDemand = Union[int, str]  # an int block count, or "all"


def cores(kind: str, cube: CoreDemand = 0, vector: CoreDemand = 0, all_resident: bool = False,
          limit_applies: bool = True) -> dict:
    """A device profile dict (a fresh one per call, so no two ops share a mutable profile)."""
    return {"kind": kind, "cube": cube, "vector": vector, "all_resident": all_resident,
            "limit_applies": limit_applies}


def _vector() -> dict:
    return cores("AIV", vector="all")


def _cube() -> dict:
    return cores("AICore", cube="all")


def _mix() -> dict:
    """Cube matmul with a vector epilogue (dequant, softmax, activation): both core types."""
    return cores("AICore", cube="all", vector="all")


def _mc2() -> dict:
    """MC2 dispatch/combine run on every AIV core at once and wait on peers: full-core sync."""
    return cores("MC2", vector="all", all_resident=True)


@dataclass(frozen=True)
class OpSpec:
    """One custom op: ``name`` is "op" or "op.overload", ``schema`` what ``Library.define`` takes."""

    name: str
    schema: str
    impl: Callable
    cores: dict


def _spec(schema: str, impl: Callable, profile: dict) -> OpSpec:
    return OpSpec(schema[:schema.index("(")], schema, impl, profile)


_GMM_COMMON = (
    "Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, Tensor[]? offset=None, "
    "Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, ")
_GMM_ACTIVATION = (
    "Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, "
    "Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=None, int? group_list_type=0, "
    "int? act_type=0, ")
_FORMAT_CAST_KW = "*, int? customize_dtype=None, int? input_dtype=None"

OPS = [
    _spec("npu_swiglu(Tensor self, int dim=-1) -> Tensor", ref.npu_swiglu, _vector()),
    _spec("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
          ref.npu_rms_norm, _vector()),
    _spec("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
          ref.npu_add_rms_norm, _vector()),
    # In place: x1 <- rms_norm(x1+x2)*gamma, x2 <- x1+x2.  Functionalization rewrites it to the
    # _functional variant (library._add_functionalization), as torch_npu's codegen does.
    _spec("npu_add_rms_norm_v2(Tensor(a!) x1, Tensor(b!) x2, Tensor gamma, float epsilon=1e-06) -> Tensor",
          ref.npu_add_rms_norm_v2, _vector()),
    _spec("npu_add_rms_norm_v2_functional(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
          "-> (Tensor, Tensor, Tensor)", ref.npu_add_rms_norm_v2_functional, _vector()),
    _spec("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor",
          ref.npu_rotary_mul, _vector()),
    _spec("npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
          "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)",
          ref.npu_dynamic_quant, _vector()),
    _spec("npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
          "Tensor? pertoken_scale=None, Tensor? bias=None, int? output_dtype=None, int? x1_dtype=None, "
          "int? x2_dtype=None, int? pertoken_scale_dtype=None, int? scale_dtype=None, int[]? group_sizes=None, "
          "Tensor? y_scale=None) -> Tensor", ref.npu_quant_matmul, _mix()),
    _spec("npu_grouped_matmul(" + _GMM_COMMON + "Tensor? group_list=None, " + _GMM_ACTIVATION
          + "int[]? tuning_config=None, int? output_dtype=None, int? x_dtype=None, int? weight_dtype=None, "
          "int? scale_dtype=None, int? per_token_scale_dtype=None) -> Tensor[]", ref.npu_grouped_matmul, _mix()),
    _spec("npu_grouped_matmul.List(" + _GMM_COMMON + "int[]? group_list=None, " + _GMM_ACTIVATION
          + "ScalarType? output_dtype=None) -> Tensor[]", ref.npu_grouped_matmul_list, _mix()),
    _spec("npu_moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)",
          ref.npu_moe_gating_top_k_softmax, _vector()),
    _spec("npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, Tensor? input_ids=None, "
          "Tensor? tid2eid=None, int k_group=1, int group_count=1, int group_select_mode=0, int renorm=0, "
          "int norm_type=0, bool out_flag=False, float routed_scaling_factor=1.0, float eps=1e-20) "
          "-> (Tensor, Tensor, Tensor)", ref.npu_moe_gating_top_k, _vector()),
    _spec("npu_moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) "
          "-> (Tensor, Tensor, Tensor)", ref.npu_moe_init_routing, _vector()),
    _spec("npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, "
          "int active_num=-1, int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, "
          "int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, int quant_mode=-1, "
          "int[2] active_expert_range=[], int row_idx_type=0, int? x_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)",
          ref.npu_moe_init_routing_v2, _vector()),
    _spec("npu_moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, "
          "Tensor? scales, Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0, "
          "int? k=1) -> Tensor", ref.npu_moe_finalize_routing, _vector()),
    _spec("npu_moe_distribute_dispatch(Tensor x, Tensor expert_ids, str group_ep, int ep_world_size, "
          "int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, Tensor? x_active_mask=None, "
          "Tensor? expert_scales=None, str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, "
          "int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, int quant_mode=0, "
          "int global_bs=0, int expert_token_nums_type=1) "
          "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", ref.npu_moe_distribute_dispatch, _mc2()),
    _spec("npu_moe_distribute_combine(Tensor expand_x, Tensor expert_ids, Tensor expand_idx, "
          "Tensor ep_send_counts, Tensor expert_scales, str group_ep, int ep_world_size, int ep_rank_id, "
          "int moe_expert_num, *, Tensor? tp_send_counts=None, Tensor? x_active_mask=None, "
          "Tensor? activation_scale=None, Tensor? weight_scale=None, Tensor? group_list=None, "
          "Tensor? expand_scales=None, Tensor? shared_expert_x=None, str group_tp=\"\", int tp_world_size=0, "
          "int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, "
          "int global_bs=0, int out_dtype=0, int comm_quant_mode=0, int group_list_type=0) -> Tensor",
          ref.npu_moe_distribute_combine, _mc2()),
    _spec("npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
          "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
          "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
          "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
          "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
          "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
          "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
          "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
          "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
          "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
          "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
          "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
          "bool softmax_lse_flag=False) -> (Tensor, Tensor)", ref.npu_fused_infer_attention_score, _mix()),
    # A cache-maintenance (CMO) task on the L2 path: it occupies no compute cores and ignores limits.
    _spec("npu_prefetch(Tensor self, Tensor? dependency, int max_size, int offset=0) -> ()", ref.npu_prefetch,
          cores("AIV", limit_applies=False)),
    # TransData is a TBE kernel: core limits are not guaranteed to reach it.
    _spec(f"npu_format_cast(Tensor self, int acl_format, {_FORMAT_CAST_KW}) -> Tensor", ref.npu_format_cast,
          cores("AIV", vector="all", limit_applies=False)),
    _spec(f"npu_format_cast.Tensor(Tensor self, Tensor dst, {_FORMAT_CAST_KW}) -> Tensor",
          ref.npu_format_cast_tensor, cores("AIV", vector="all", limit_applies=False)),
    _spec(f"npu_format_cast_(Tensor(a!) self, Tensor src, {_FORMAT_CAST_KW}) -> Tensor(a!)",
          ref.npu_format_cast_inplace, cores("AIV", vector="all", limit_applies=False)),
    _spec(f"npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, {_FORMAT_CAST_KW}) -> Tensor(a!)",
          ref.npu_format_cast_inplace_acl_format, cores("AIV", vector="all", limit_applies=False)),
]

from . import flash_attention  # noqa: E402  (family module: its SPECS until the registry gathers them)

OPS += flash_attention.SPECS
OPS_BY_NAME = {spec.name: spec for spec in OPS}

# torch_npu has no npu_nonzero: aten nonzero is the full-core-sync op (NonZero must hold every
# vector core at once), the classic partner of AIV collectives in a core-occupation deadlock.
ATEN_CORES = {"nonzero": cores("AIV", vector="all", all_resident=True)}
ATEN_CORES.update({name: _cube() for name in (
    "mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "addbmm", "mv", "addmv",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "convolution_backward")})
DEFAULT_ATEN_CORES = _vector()

