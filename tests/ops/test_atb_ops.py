"""torch_npu's whole ATB op surface (``torch.ops.atb``, read off the wheel's libop_plugin_atb.so by
tools/gen_op_schemas.py): every name exists where torch_npu exports it, with its real schema; ops
without math fail clearly; the ops with math keep it."""
from __future__ import annotations

import pathlib

import pytest
import torch

import pytest_npugraph
import torch_npu
from pytest_npugraph.runtime.ops import _generated, batchmatmul, library, paged, registry, rope, unpad_attention

EXPORTS = registry.atb_exports()
NAMES = registry.atb_names()
WITH_MATH = {"_npu_paged_attention": paged._npu_paged_attention, "_npu_reshape_and_cache": paged._npu_reshape_and_cache,
             "_npu_reshape_and_cache_siso": paged._npu_reshape_and_cache_siso,
             "npu_paged_cache_load.out": paged.npu_paged_cache_load_out,
             "_npu_rotary_embedding": rope._npu_rotary_embedding,
             "_npu_flash_attention": unpad_attention._npu_flash_attention,
             "_npu_flash_attention_unpad": unpad_attention._npu_flash_attention_unpad,
             "_npu_flash_attention_unpad_v2": unpad_attention._npu_flash_attention_unpad_v2,
             "_npu_matmul_add_fp32": batchmatmul._npu_matmul_add_fp32}


def _overload(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.atb, base), overload or "default")


def test_the_table_holds_every_name_torch_npu_lists():
    assert len(EXPORTS) == len(_generated.ATB_TOP_LEVEL) + len(_generated.ATB_MODULE) == 29
    assert {name.split(".", 1)[0] for name in NAMES} == set(EXPORTS)
    assert len(NAMES) == len(set(NAMES)) == 37
    npu = {name.split(".", 1)[0] for name in registry.generated_names()}
    assert not {name.split(".", 1)[0] for name in NAMES} & npu


@pytest.mark.parametrize("name", NAMES)
def test_every_overload_exists_in_the_atb_namespace_with_its_real_schema(name):
    schema = next(s for s in _generated.ATB_SCHEMAS if s.startswith(name + "("))
    assert _overload(name)._schema == torch._C.parse_schema("atb::" + schema)


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_name_is_exported_where_torch_npu_exports_it(name):
    packet = getattr(torch.ops.atb, name)
    if EXPORTS[name] == "torch_npu":                 # _atb_ops.API_LIST
        assert getattr(torch_npu, name) is packet
        assert name in dir(torch_npu)
    else:                                            # _atb_ops.ATB_API_LIST: torch_npu.atb only
        assert getattr(torch_npu.atb, name) is packet
        assert name in dir(torch_npu.atb) and name not in dir(torch_npu)
        with pytest.raises(AttributeError):
            getattr(torch_npu, name)
    assert not hasattr(torch, name)                  # torch.<name> wrappers are for the npu namespace only
    assert name not in dir(torch.ops.npu) and name in dir(torch.ops.atb)


def test_an_atb_op_without_math_names_itself_its_schema_and_the_hook(npugraph):
    q = torch.zeros(2, 1, 8, dtype=torch.float16).npu()
    with pytest.raises(NotImplementedError) as info:
        torch_npu._npu_flash_attention_v3(q, q, q, torch.zeros(2, 2, dtype=torch.float16).npu(), torch.tensor([2]),
                                          1.0, 1, 1, out=torch.zeros_like(q))
    message = str(info.value)
    assert message.startswith("torch.ops.atb._npu_flash_attention_v3 (torch_npu._npu_flash_attention_v3) has no CPU "
                              "implementation in pytest-npugraph")
    assert "Schema: atb::_npu_flash_attention_v3(Tensor query, Tensor key, Tensor value, Tensor mask, Tensor seq_len, " \
           "float scale_value, int num_heads, int num_kv_heads, *, int ? mask_type = 3, Tensor(a!) out) -> ()" in message
    assert "def pytest_npugraph_register_ops(registry):" in message and "'kind': 'ATB'" in message
    with pytest.raises(NotImplementedError, match=r"torch.ops.atb.npu_ring_mla \(torch_npu.atb.npu_ring_mla\)"):
        torch_npu.atb.npu_ring_mla(*[torch.zeros(1).npu()] * 7, 1, 1)


def test_the_atb_ops_with_math_keep_it_on_their_real_schema():
    for name, impl in WITH_MATH.items():
        spec = library.SPECS[name]
        assert spec.impl is impl and spec.namespace == "atb" and spec.cores["kind"] == "ATB"
        assert spec.schema in _generated.ATB_SCHEMAS
    assert registry.table()["_npu_paged_attention"].graph_updatable
    workspace = library.SPECS["_npu_paged_attention_get_workspace"]     # a host-side query, as atb_cores names it
    assert workspace.impl is paged._npu_paged_attention_get_workspace and workspace.namespace == "atb"
    assert workspace.cores == registry.atb_cores("_npu_paged_attention_get_workspace")


def test_every_atb_op_has_an_atb_profile_or_runs_on_the_host():
    for name in NAMES:
        kind = registry.table()[name].cores["kind"]
        assert kind == ("AICPU" if "_get_workspace" in name else "ATB"), name
    assert registry.table()["_npu_flash_attention"].cores["cube"] == "all"
    assert registry.table()["_npu_reshape_and_cache_siso"].cores["cube"] == 0


def test_an_atb_op_without_math_traces_through_its_meta(npugraph):
    """``-> ()`` ops need no rule; npu_multi_head_latent_attention has the wheel's meta."""
    q_nope, q_rope = torch.zeros(3, 2, 8, device="meta"), torch.zeros(3, 2, 4, dtype=torch.float16, device="meta")
    block_tables = torch.zeros(3, 1, device="meta")
    out = torch.ops.atb.npu_multi_head_latent_attention(q_nope, q_rope, q_nope, q_rope, block_tables, [1, 1, 1], 2, 1.0, 1)
    assert out.shape == (3, 2, 8) and out.dtype == torch.float16
    assert torch.ops.atb._npu_matmul_add_fp32(torch.zeros(2, 2, device="meta"), torch.zeros(2, 2, device="meta"),
                                               torch.zeros(2, 2, device="meta")) is None


USER_ATB = """
import torch, torch_npu

def test_user_math_for_an_atb_op(npugraph):
    c = torch.zeros(2, 2).npu()
    torch_npu._npu_matmul_add_fp32(torch.ones(2, 3).npu(), torch.ones(2, 3).npu(), c)
    assert c.cpu().tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert torch_npu._npu_matmul_add_fp32 is torch.ops.atb._npu_matmul_add_fp32
"""


def test_users_supply_an_atb_op_through_the_hook(pytester, monkeypatch):
    # the subprocess imports the pytest_npugraph this test runs with (a relative PYTHONPATH would not reach it)
    monkeypatch.setenv("PYTHONPATH", str(pathlib.Path(pytest_npugraph.__file__).resolve().parents[1]))
    pytester.makeconftest("""
        def pytest_npugraph_register_ops(registry):
            def _npu_matmul_add_fp32(x, weight, C):
                C.add_(x @ weight.T)
            registry.register('_npu_matmul_add_fp32',
                              '_npu_matmul_add_fp32(Tensor x, Tensor weight, Tensor(a!) C) -> ()',
                              _npu_matmul_add_fp32, cores={'kind': 'ATB', 'cube': 'all'})
    """)
    pytester.makepyfile(test_user_atb=USER_ATB)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "--npu-emulate=on")
    result.assert_outcomes(passed=1)
