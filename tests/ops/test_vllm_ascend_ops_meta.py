"""The ops given math for vLLM-Ascend trace: under FakeTensorMode (what torch.compile and TorchAir run) each gives
the shapes and dtypes its CPU math gives, through the registered op (``torch.ops.npu`` / ``torch.ops.atb``)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

import torch_npu  # noqa: F401  (defines the ops)
from pytest_npugraph.runtime.ops import library, registry
from test_catalog import EXAMPLES

NEW = ["npu_transpose_batchmatmul", "npu_transpose_quant_batchmatmul", "_npu_matmul_add_fp32",
       "_npu_rotary_embedding", "npu_lightning_indexer", "npu_quant_lightning_indexer",
       "npu_grouped_matmul_swiglu_quant", "npu_grouped_matmul_swiglu_quant_v2", "npu_quant_grouped_matmul_dequant",
       "_npu_paged_attention_get_workspace", "npu_paged_cache_load.out", "_npu_flash_attention_unpad",
       "_npu_flash_attention_unpad_v2", "_npu_flash_attention", "npu_rms_norm_dynamic_mx_quant",
       "npu_add_rms_norm_dynamic_mx_quant", "npu_sign_bits_pack", "npu_sign_bits_unpack", "npu_dynamic_block_quant"]


def _shapes(out):
    return [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t for t in tree_flatten(out)[0]]


def _op(name):
    base, _, overload = name.partition(".")
    return getattr(library.packet(base), overload or "default")


@pytest.mark.parametrize("name", NEW)
def test_fake_tensor_shapes_are_the_cpu_maths(name):
    torch.manual_seed(0)
    spec = registry.by_name()[name]
    args, kwargs = EXAMPLES[name]()
    clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
    want = _shapes(spec.impl(*tree_map(clone, args), **tree_map(clone, kwargs)))
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
        got = _op(name)(*tree_map(fake, args), **tree_map(fake, kwargs))
    assert _shapes(got) == want

