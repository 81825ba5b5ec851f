"""torch_npu 2.14.0's whole op surface: every name exists in both namespaces with its real schema,
ops without math fail clearly, users can supply them, and the op tables derive from the specs."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import torch_npu
from pytest_npugraph.runtime.ops import _generated, library, registry
from pytest_npugraph.runtime.ops.spec import OpSpec

ROOT = pathlib.Path(__file__).resolve().parents[2]
YAML = pathlib.Path(os.environ.get(
    "NPUGRAPH_TORCH_NPU_YAML", "/work/wheel/src/torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"))
needs_yaml = pytest.mark.skipif(not YAML.is_file(), reason="torch_npu wheel's op yaml not available "
                                                           "(set NPUGRAPH_TORCH_NPU_YAML)")

NAMES = registry.generated_names()
BASES = sorted({n.split(".", 1)[0] for n in NAMES})


def _overload(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.npu, base), overload or "default")


# ----------------------------------------------------------------------------- the table
def test_generated_table_counts():
    assert len(NAMES) == len(set(NAMES)) == 419
    assert len(BASES) == 398
    assert len([b for b in BASES if b.startswith("npu_")]) == 332   # the figure


@needs_yaml
def test_generated_table_matches_an_independent_reading_of_the_yaml():
    """Count the ``custom:`` entries with a line scan (no yaml parser, no generator code)."""
    names, section = [], None
    for line in YAML.read_text().splitlines():
        if line and not line.startswith((" ", "-")):
            section = line.split(":", 1)[0]
        elif section == "custom":
            m = re.match(r"^[- ] *(?:- )?func: *([\w.]+)\(", line)
            if m:
                names.append(m.group(1))
    assert sorted(names) == sorted(NAMES)
    assert len({n.split(".")[0] for n in names if n.startswith("npu_")}) == 332


@needs_yaml
def test_generated_module_is_up_to_date_with_the_generator():
    result = subprocess.run([sys.executable, str(ROOT / "tools/gen_op_schemas.py"), str(YAML), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_family_specs_use_the_real_schemas():
    real = {s[:s.index("(")]: s for s in _generated.SCHEMAS}
    for spec in registry.specs():
        if spec.namespace != "npu":
            continue    # torch_npu's ATB ops (torch.ops.atb) are not in the npu op yaml: test_paged_cache.py
        assert spec.name in real, f"{spec.name} is not a torch_npu 2.14.0 op"
        assert torch._C.parse_schema("npu::" + spec.schema) == torch._C.parse_schema("npu::" + real[spec.name])


# ----------------------------------------------------------------------------- both namespaces
def test_every_name_exists_in_both_namespaces_with_every_overload():
    for name in NAMES:
        base = name.split(".", 1)[0]
        packet = getattr(torch_npu, base)
        # torch_npu exports the packet itself; the shim may define a Python wrapper of its own
        assert packet is getattr(torch.ops.npu, base) or (callable(packet) and base in vars(torch_npu)), base
        op = _overload(name)
        schema = next(s for s in _generated.SCHEMAS if s.startswith(name + "("))
        assert op._schema == torch._C.parse_schema("npu::" + schema), name
    assert set(BASES) <= set(dir(torch_npu))


def test_model_code_imports_succeed():
    from torch_npu import npu_fusion_attention, npu_incre_flash_attention, npu_moe_distribute_dispatch_v2  # noqa: F401
    from torch_npu import get_npu_format, npu_mm_all_reduce_base  # noqa: F401


def test_torch_dot_name_is_the_deprecated_wrapper_torch_npu_installs():
    with pytest.raises(RuntimeError, match=r"^torch.npu_ciou is deprecated and will be removed in future version. "
                                           r"Use torch_npu.npu_ciou instead.\n.*ERR00007 PTA feature not supported"):
        torch.npu_ciou(torch.rand(4, 8), torch.rand(4, 8))
    assert torch.npu_rms_norm.__name__ == "npu_rms_norm"


def test_dir_lists_ops_not_yet_looked_up():
    assert {"npu_nsa_select_attention", "npu_rms_norm"} <= set(dir(torch.ops.npu)) & set(dir(torch_npu))


def test_unknown_names_still_fail_as_attribute_errors():
    with pytest.raises(AttributeError, match="npu_not_an_op.*pytest_npugraph_register_ops"):
        torch_npu.npu_not_an_op
    assert not hasattr(torch_npu, "not_an_op_at_all")


# ----------------------------------------------------------------------------- ops without math
def test_calling_an_op_without_math_names_it_its_schema_and_the_hook():
    boxes = torch.rand(4, 8)
    with pytest.raises(NotImplementedError) as info:
        torch_npu.npu_ciou(boxes, boxes)
    message = str(info.value)
    schema = next(s for s in _generated.SCHEMAS if s.startswith("npu_ciou("))
    assert "torch.ops.npu.npu_ciou" in message and f"npu::{schema}" in message
    assert "def pytest_npugraph_register_ops(registry):" in message
    assert "def npu_ciou(self, gtboxes, trans=False, is_cross=True, mode=0, atan_sub_flag=False):" in message
    assert f"registry.register('npu_ciou', {schema!r}," in message
    assert "cores={'kind': 'AIV', 'vector': 'all'}" in message


def test_the_snippet_in_the_message_is_valid_python():
    with pytest.raises(NotImplementedError) as info:
        torch.ops.npu.npu_bert_apply_adam.out
        torch.ops.npu.npu_silu_(torch.zeros(2))
    snippet = str(info.value).split("Supply it in your conftest.py:\n", 1)[1]
    namespace: dict = {}
    exec(compile(snippet.replace("    def", "def", 1).replace("\n    ", "\n"), "<snippet>", "exec"), namespace)
    assert callable(namespace["pytest_npugraph_register_ops"])


def test_ops_without_math_on_npu_tensors_raise_the_same_error(npugraph):
    x = torch.randn(4, 8).npu()
    with pytest.raises(NotImplementedError, match=r"npu_mish.*\n.*Schema: npu::npu_mish"):
        torch_npu.npu_mish(x)


def test_meta_of_ops_without_math_follows_the_schema():
    x = torch.empty(3, 4, device="meta")
    assert torch.ops.npu.npu_silu_(x) is x                 # Tensor(a!) -> the aliased argument
    assert torch.ops.npu.npu_format_cast_.acl_format(x, 2) is not None
    with pytest.raises(NotImplementedError, match="npu_mish.*has no CPU implementation"):
        torch.ops.npu.npu_mish(x)                          # result shape unknown: refuse clearly


def test_tracing_an_op_without_math_raises_the_clear_error():
    def f(x):
        return torch_npu.npu_mish(x) + 1

    with pytest.raises(Exception) as info:
        torch.compile(f, backend="eager", fullgraph=True)(torch.randn(4))
    assert "npu_mish" in str(info.value) and "pytest_npugraph_register_ops" in str(info.value)


def test_ops_without_math_have_a_core_profile_guessed_from_the_name():
    table = registry.table()
    assert table["npu_mm_all_reduce_base"].cores["kind"] == "MC2"
    assert table["npu_moe_distribute_dispatch_v2"].cores["all_resident"] is True
    assert table["npu_all_gather_base_mm"].cores["kind"] == "MC2"
    assert (table["npu_weight_quant_batchmatmul"].cores["cube"], table["npu_weight_quant_batchmatmul"].cores["vector"]) \
        == ("all", "all")
    assert table["npu_bmmV2"].cores["cube"] == "all" and table["npu_bmmV2"].cores["vector"] == 0
    assert table["npu_prompt_flash_attention"].cores["kind"] == "AICore"
    assert table["npu_mish"].cores == {"kind": "AIV", "cube": 0, "vector": "all", "all_resident": False,
                                            "limit_applies": True}
    assert library.cores_of("npu_mm_reduce_scatter_base")["kind"] == "MC2"


def test_defining_every_op_is_lazy_and_complete():
    library.define_all()
    assert set(NAMES) <= set(library.SPECS)
    assert not library._PENDING


# ----------------------------------------------------------------------------- user overrides
def test_a_user_registration_replaces_the_op_schema_included():
    spec = registry.table()["npu_moe_distribute_dispatch"]
    same = library.UserOp(spec.name, spec.schema, lambda *a, **k: None)
    kept = library._override(spec, same)
    assert kept.impl is same.impl and kept.mc2 is spec.mc2 and kept.cores == spec.cores
    mine = library.UserOp(spec.name, "npu_moe_distribute_dispatch(Tensor x) -> Tensor", lambda x: x, {"kind": "AICPU"})
    replaced = library._override(spec, mine)
    assert replaced.schema == mine.schema and replaced.impl is mine.impl and replaced.cores == {"kind": "AICPU"}
    assert replaced.mc2 is None      # the multi-rank kernel expects the real signature


OVERRIDE = """
import torch, torch_npu

def test_user_math_replaces_the_missing_one(npugraph):
    x = torch.randn(3, 4)
    y = torch_npu.npu_mish(x.npu())
    torch.testing.assert_close(y.cpu(), x * 2)
    assert torch.ops.npu.npu_mish(x).sum() == (x * 2).sum()
    kernels = [r for r in npugraph.trace.records if type(r).__name__ == "Kernel" and "npu_mish" in r.op]
    assert kernels and kernels[0].cores.kind == "AICPU"

def test_user_math_replaces_the_emulators(npugraph):
    assert torch_npu.npu_swiglu(torch.ones(2, 4)).tolist() == [[7.0]]

def test_a_users_own_schema_replaces_the_real_one():
    assert torch_npu.npu_ciou(torch.zeros(2), 3).tolist() == [3.0, 3.0]

def test_others_still_raise():
    import pytest
    with pytest.raises(NotImplementedError, match="npu_mish_backward"):
        torch_npu.npu_mish_backward(torch.ones(1), torch.ones(1))
"""


def test_a_user_hook_overrides_a_generated_op_and_a_family_op(pytester):
    pytester.makeconftest("""
        import torch
        def pytest_npugraph_register_ops(registry):
            registry.register("npu_mish", "npu_mish(Tensor self) -> Tensor", lambda self: self * 2,
                              cores={"kind": "AICPU"})
            registry.register("npu_swiglu", "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
                              lambda self, dim=-1: torch.tensor([[7.0]]))
            registry.register("npu_ciou", "npu_ciou(Tensor a, int k) -> Tensor", lambda a, k: a + k)
    """)
    pytester.makepyfile(OVERRIDE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--npu-emulate=on")
    result.assert_outcomes(passed=4)


# ----------------------------------------------------------------------------- derived tables
def test_derived_tables_equal_the_hand_written_ones_they_replace():
    from pytest_npugraph.runtime import collectives, graphs
    from pytest_npugraph.compiler import reinplace

    assert reinplace.MULTI_INPLACE == {
        "npu_kv_rmsnorm_rope_cache_v2_functional": ("npu_kv_rmsnorm_rope_cache_v2", (5, 6)),
        "npu_mla_prolog_v3_functional": ("npu_mla_prolog_v3", (9, 10)),
        "npu_add_rms_norm_v2_functional": ("npu_add_rms_norm_v2", (0, 1)),
    }
    assert set(graphs.updatable_ops()) == {
        "npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2", "npu_fusion_attention_v3",
        "_npu_paged_attention", "npu_multi_head_latent_attention"}
    mc2 = registry.mc2_kernels()
    assert mc2 and all(callable(kernel) for kernel in mc2.values())
    assert all(registry.table()[name].cores["kind"] == "MC2" for name in mc2)
    collectives.install()
    assert {"npu_moe_distribute_dispatch", "npu_moe_distribute_combine"} <= set(collectives.MATH)


def test_the_mc2_ops_math_is_read_off_their_specs():
    """Each multi-rank MC2 op carries its kernel and its collective math on its spec (ops/mc2.py);
    the collectives package keeps only the c10d collectives' math (c10d_math.py) and takes the rest from
    the specs."""
    from pytest_npugraph.runtime import collectives
    from pytest_npugraph.runtime.collectives import c10d_math
    from pytest_npugraph.runtime.ops import mc2

    multi = [spec for spec in registry.specs() if spec.mc2 is not None]
    assert {spec.name for spec in multi} == {spec.name for spec in mc2.SPECS}
    collectives.install()
    for spec in multi:
        assert spec.mc2_math is not None and collectives.MATH[spec.name] is spec.mc2_math
        assert spec.mc2.__module__ == spec.mc2_math.__module__ == mc2.__name__
    c10d = {name for name, math in collectives.MATH.items() if math.__module__ == c10d_math.__name__}
    assert "all_reduce" in c10d and set(collectives.MATH) == c10d | set(registry.mc2_kernels())
    assert not c10d & set(registry.mc2_kernels())


def test_a_family_spec_is_all_it_takes_to_add_an_op(monkeypatch):
    """Adding an op is one OpSpec in one family module: the registry finds it there."""
    from pytest_npugraph.runtime.ops import norms

    extra = OpSpec("npu_gelu(Tensor self, *, str approximate='none') -> Tensor", lambda self, *, approximate="none":
                   torch.nn.functional.gelu(self), graph_updatable=True)
    monkeypatch.setattr(norms, "SPECS", norms.SPECS + [extra])
    monkeypatch.setattr(registry, "_specs", None)
    monkeypatch.setattr(registry, "_table", None)
    assert registry.by_name()["npu_gelu"].cores["kind"] == "AIV"
    assert registry.table()["npu_gelu"].impl is extra.impl
    assert "npu_gelu" in registry.graph_updatable()


NEW_OP = """
import pytest, torch, torch_npu, torchair

def scale(x, s):
    return torch_npu.npu_my_scale(x, s) + 1

def test_eager_values_and_profile(npugraph):
    y = torch_npu.npu_my_scale(torch.ones(2, 4).npu(), 3.0)
    assert y.cpu().tolist() == [[3.0] * 4] * 2
    kernel = [r for r in npugraph.trace.records if type(r).__name__ == "Kernel" and "npu_my_scale" in r.op][-1]
    assert kernel.cores.kind == "ATB" and kernel.cores.vector == 48

@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead", "npugraph_ex"])
def test_compiled_in_every_mode(npugraph, mode):
    if mode == "npugraph_ex":
        backend = "npugraph_ex"
    else:
        config = torchair.CompilerConfig()
        config.mode = mode
        backend = torchair.get_npu_backend(compiler_config=config)
    f = torch.compile(scale, backend=backend, dynamic=False)
    for _ in range(2):
        assert f(torch.ones(2, 4).npu(), 2.0).cpu().tolist() == [[3.0] * 4] * 2

def test_its_profile_drives_the_core_checks(npugraph):
    s = torch.npu.current_stream()
    with npugraph.expect("limit-ineffective", match="npu_my_scale"):
        torch.npu.set_stream_limit(s, 8, 16)
        torch_npu.npu_my_scale(torch.ones(2, 4).npu(), 3.0)
"""


def test_a_new_op_is_one_registration_in_conftest(pytester):
    """Adding an op touches one place: its schema, math and core profile in the hook make it callable
    eagerly, traced in every compile mode, and checked by the core rules through its profile."""
    pytester.makeconftest("""
        def pytest_npugraph_register_ops(registry):
            registry.register("npu_my_scale", "npu_my_scale(Tensor self, float s) -> Tensor",
                              lambda self, s: self * s, cores={"kind": "ATB", "vector": "all"})
    """)
    pytester.makepyfile(test_new_op=NEW_OP)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)
