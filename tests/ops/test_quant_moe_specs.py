"""The norm/quant/MoE family specs as the runtime registers them: schema vs impl signature,
meta vs reference shapes, NPU-tensor calls recorded with the profile, and tracing under
torch.compile (fullgraph, static and dynamic shapes), existing MoE/quant ops included.
"""
from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import torch_npu
from pytest_npugraph.runtime.ops import gmm, mc2, moe, norms, quant
from pytest_npugraph.trace import Kernel

# The ops this suite covers, by family (the families' other ops are tested in test_reference_ops.py).
COVERED = {"npu_add_rms_norm_quant", "npu_add_rms_norm_dynamic_quant", "npu_add_layer_norm", "npu_quantize",
           "npu_anti_quant", "npu_dynamic_quant_asymmetric", "npu_weight_quant_batchmatmul",
           "npu_dequant_swiglu_quant", "npu_moe_compute_expert_tokens", "npu_moe_token_permute",
           "npu_moe_token_unpermute", "npu_grouped_matmul_finalize_routing", "npu_moe_distribute_dispatch_v2",
           "npu_moe_distribute_combine_v2", "npu_mm_all_reduce_base", "npu_all_gather_base_mm",
           "npu_mm_reduce_scatter_base"}
SPECS = [s for m in (norms, quant, moe, gmm, mc2) for s in m.SPECS if s.name in COVERED]


def _ids(n=4, e=6, k=2):
    return torch.stack([torch.randperm(e)[:k] for _ in range(n)]).to(torch.int32)


# One realistic call per op: (positional args, keyword args), CPU tensors.
EXAMPLES = {
    "npu_add_rms_norm_quant": lambda: ((torch.randn(2, 8, dtype=torch.float16), torch.randn(2, 8, dtype=torch.float16),
                                        torch.ones(8, dtype=torch.float16), torch.rand(8) + 0.1,
                                        torch.zeros(8, dtype=torch.int32)), {"epsilon": 1e-5}),
    "npu_add_rms_norm_dynamic_quant": lambda: ((torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.ones(16)),
                                               {"smooth_scale1": torch.rand(16), "smooth_scale2": torch.rand(16)}),
    "npu_add_layer_norm": lambda: ((torch.randn(2, 8), torch.randn(2, 8), torch.ones(8), torch.zeros(8)), {}),
    "npu_quantize": lambda: ((torch.randn(2, 3, 16), torch.rand(16) + 0.1, None, torch.qint8, -1, False), {}),
    "npu_anti_quant": lambda: ((torch.randint(-5, 5, (2, 8), dtype=torch.int8), torch.rand(8)),
                               {"offset": torch.randn(8), "dst_dtype": torch.bfloat16}),
    "npu_dynamic_quant_asymmetric": lambda: ((torch.randn(4, 16, dtype=torch.float16),), {"dst_type": torch.quint4x2}),
    "npu_weight_quant_batchmatmul": lambda: ((torch.randn(3, 8, dtype=torch.float16),
                                              torch.randint(-8, 8, (8, 4), dtype=torch.int8),
                                              torch.rand(4, dtype=torch.float16)), {}),
    "npu_dequant_swiglu_quant": lambda: ((torch.randint(-20, 20, (4, 8), dtype=torch.int32),), {
        "weight_scale": torch.rand(1, 8), "activation_scale": torch.rand(4), "quant_scale": torch.rand(1, 4),
        "group_index": torch.tensor([4]), "activate_left": True, "quant_mode": 1}),
    "npu_moe_compute_expert_tokens": lambda: ((torch.tensor([0, 0, 1, 3, 3], dtype=torch.int32), 4), {}),
    "npu_moe_token_permute": lambda: ((torch.randn(4, 6), _ids().to(torch.int64)), {}),
    "npu_moe_token_unpermute": lambda: ((torch.randn(8, 6), torch.randperm(8).to(torch.int32)),
                                        {"probs": torch.rand(4, 2)}),
    "npu_grouped_matmul_finalize_routing": lambda: ((torch.randint(-5, 5, (6, 8), dtype=torch.int8),
                                                     torch.randint(-5, 5, (3, 8, 4), dtype=torch.int8),
                                                     torch.tensor([2, 2, 2])), {
        "scale": torch.rand(3, 4), "pertoken_scale": torch.rand(6), "logit": torch.rand(6),
        "row_index": torch.tensor([0, 1, 2, 0, 1, 2]), "output_bs": 3}),
    # MC2 ops with a world of one rank (their multi-rank form is in tests/distributed/test_mc2_family.py)
    "npu_moe_distribute_dispatch_v2": lambda: ((torch.randn(4, 8), _ids(4, 4), "ep", 1, 0, 4),
                                               {"expert_scales": torch.rand(4, 2), "quant_mode": 2,
                                                "comm_alg": "fullmesh_v2"}),
    "npu_moe_distribute_combine_v2": lambda: ((torch.randn(8, 8), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]],
                                                                               dtype=torch.int32),
                                               torch.zeros(1024, dtype=torch.int32),
                                               torch.tensor([2, 4, 6, 8], dtype=torch.int32), torch.rand(4, 2),
                                               "ep", 1, 0, 4), {"shared_expert_x": torch.randn(4, 8)}),
    "npu_mm_all_reduce_base": lambda: ((torch.randn(2, 3, 8, dtype=torch.bfloat16),
                                        torch.randn(8, 4, dtype=torch.bfloat16), "tp"),
                                       {"bias": torch.randn(4, dtype=torch.bfloat16),
                                        "x3": torch.randn(2, 3, 4, dtype=torch.bfloat16)}),
    "npu_all_gather_base_mm": lambda: ((torch.randint(-5, 5, (4, 8), dtype=torch.int8),
                                        torch.randint(-5, 5, (8, 4), dtype=torch.int8), "tp", 1),
                                       {"x1_scale": torch.rand(4, 1), "x2_scale": torch.rand(1, 4)}),
    "npu_mm_reduce_scatter_base": lambda: ((torch.randn(4, 8), torch.randn(8, 3), "tp", 1), {}),
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(5)


def test_every_spec_has_an_example_and_a_meta():
    assert set(EXAMPLES) == {s.name for s in SPECS} == COVERED
    for spec in SPECS:
        assert spec.meta is not None and spec.cores is not None and spec.impl is not None


def _same_default(python_default, schema_default) -> bool:
    if isinstance(python_default, (list, tuple)) or isinstance(schema_default, (list, tuple)):
        return list(python_default) == list(schema_default)
    if isinstance(schema_default, float):
        return python_default == pytest.approx(schema_default)
    return python_default == schema_default


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_impl_and_meta_signatures_are_the_schema(spec):
    schema = torch._C.parse_schema(spec.schema)
    for fn in (spec.impl, spec.meta):
        params = inspect.signature(fn).parameters
        assert list(params) == [a.name for a in schema.arguments]
        for arg in schema.arguments:
            param = params[arg.name]
            kind = inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
            assert param.kind == kind, arg.name
            if arg.has_default_value():
                assert _same_default(param.default, arg.default_value), (arg.name, param.default)
            else:
                assert param.default is inspect.Parameter.empty, arg.name


def _call(name, args, kwargs):
    base, _, overload = name.partition(".")
    return getattr(torch.ops.npu, base).__getattr__(overload or "default")(*args, **kwargs)


def _described(out):
    return [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t for t in tree_flatten(out)[0]]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_meta_agrees_with_the_reference(spec):
    args, kwargs = EXAMPLES[spec.name]()
    expected = spec.impl(*args, **kwargs)
    meta = _call(spec.name, *tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs)))
    assert _described(meta) == _described(expected)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_op_on_npu_tensors_matches_the_reference_and_records_its_profile(npugraph, spec):
    args, kwargs = EXAMPLES[spec.name]()
    expected = spec.impl(*args, **kwargs)
    npu = tree_map(lambda t: t.npu() if isinstance(t, torch.Tensor) else t, (args, kwargs))
    out = getattr(torch_npu, spec.base)(*npu[0], **npu[1])
    for got, want in zip(tree_flatten(out)[0], tree_flatten(expected)[0]):
        assert got.device.type == "npu"
        assert torch.equal(got.cpu(), want)
    (k,) = [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.op == f"npu::{spec.base}"]
    assert k.cores.kind == spec.cores["kind"] and k.reads and k.writes
    if spec.cores["kind"] == "MC2":      # MC2: every vector core, all resident while it waits for peers
        assert (k.cores.vector, k.cores.all_resident) == (npugraph.vector_cores, True)


def _backend(name):
    """A torch.compile backend: Dynamo's own, or TorchAir's in GE (max-autotune) / aclgraph mode."""
    if not name.startswith("torchair"):
        return name
    import torchair
    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    config.mode = name.split(":")[1]
    return torchair.get_npu_backend(compiler_config=config)


def _compile_cases():
    for spec in SPECS:
        for backend in ("eager", "aot_eager", "torchair:max-autotune", "torchair:reduce-overhead"):
            yield pytest.param(spec, backend, id=f"{spec.name}-{backend}")


@pytest.mark.parametrize("spec,backend", list(_compile_cases()))
def test_op_traces_under_torch_compile(npugraph, spec, backend):
    torch._dynamo.reset()
    args, kwargs = EXAMPLES[spec.name]()
    npu = tree_map(lambda t: t.npu() if isinstance(t, torch.Tensor) else t, (args, kwargs))

    def f(*a):
        return getattr(torch_npu, spec.base)(*a, **npu[1])

    out = torch.compile(f, backend=_backend(backend), fullgraph=True, dynamic=False)(*npu[0])
    for got, want in zip(tree_flatten(out)[0], tree_flatten(spec.impl(*args, **kwargs))[0]):
        assert torch.equal(got.cpu(), want)


def _existing_calls():
    x = torch.randn(4, 8)
    return {
        "npu_moe_gating_top_k_softmax": ((x, None, 2), {}),
        "npu_moe_gating_top_k": ((torch.randn(4, 16), 2), {"bias": torch.randn(16), "k_group": 2, "group_count": 4,
                                                            "norm_type": 1}),
        "npu_moe_init_routing_v2": ((x, _ids(4, 4)), {"active_num": 8, "expert_num": 4, "expert_tokens_num_type": 1,
                                                       "expert_tokens_num_flag": True}),
        "npu_moe_finalize_routing": ((torch.randn(8, 8), None, None, None, torch.rand(4, 2),
                                      torch.randperm(8).to(torch.int32), _ids(4, 4)), {"drop_pad_mode": 2, "k": 2}),
        "npu_quant_matmul": ((torch.randint(-5, 5, (2, 8), dtype=torch.int8),
                              torch.randint(-5, 5, (8, 4), dtype=torch.int8), torch.rand(4)),
                             {"pertoken_scale": torch.rand(2), "output_dtype": torch.bfloat16}),
    }


@pytest.mark.parametrize("name", sorted(_existing_calls()))
def test_existing_moe_and_quant_ops_trace_under_torch_compile(npugraph, name):
    """npu_moe_gating_top_k_softmax failed here before: its shape rule ran the reference (which
    calls torch.arange) inside FakeTensorMode's Meta invocation, recursing in prims.iota."""
    torch._dynamo.reset()
    args, kwargs = _existing_calls()[name]
    npu = tree_map(lambda t: t.npu() if isinstance(t, torch.Tensor) else t, (args, kwargs))

    def f(*a):
        return getattr(torch_npu, name)(*a, **npu[1])

    out = torch.compile(f, backend="aot_eager", fullgraph=True)(*npu[0])
    for got, want in zip(tree_flatten(out)[0], tree_flatten(f(*npu[0]))[0]):
        assert torch.equal(got.cpu(), want.cpu())


def test_dynamic_shapes_trace_through_the_explicit_meta(npugraph):
    """The explicit shape rules take symbolic sizes (the run-on-zeros fallback cannot)."""
    torch._dynamo.reset()

    def f(x1, x2, gamma):
        y1, _, x, s1, _ = torch_npu.npu_add_rms_norm_dynamic_quant(x1, x2, gamma)
        return y1, x, s1

    compiled = torch.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for rows in (3, 5, 7):
        x1, x2, gamma = torch.randn(rows, 16), torch.randn(rows, 16), torch.rand(16)
        out = compiled(x1.npu(), x2.npu(), gamma.npu())
        for got, want in zip(out, f(x1, x2, gamma)):
            assert torch.equal(got.cpu(), want)
