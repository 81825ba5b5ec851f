"""``npu_convert_weight_to_int4pack``: int32 values in [-8, 7] packed eight per int32, as vLLM-Ascend's
W4A4/W4A8/W4A16 methods prepare weights for ``npu_quant_matmul`` / ``npu_weight_quant_batchmatmul``.

The independent check: the packed words against a bit-by-bit Python packing, and the packed weight fed to
the matmuls (the wheel doc's example, both weight layouts) against a float matmul of the int values."""
from __future__ import annotations

import pytest
import torch

import torch_npu
from graph.helpers import backend


def _word(values):
    """An int32 holding eight int4 values, the first in bits 0..3, as a signed Python int."""
    word = 0
    for i, v in enumerate(values):
        word |= (v & 0xF) << (4 * i)
    return word - (1 << 32) if word >= 1 << 31 else word


def _weight(k=16, n=24, seed=0):
    return torch.randint(-8, 8, (k, n), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


def test_each_word_holds_eight_consecutive_values_lowest_nibble_first(npugraph):
    w = _weight()
    w[0, :8] = torch.tensor([-8, 7, -1, 0, 1, -2, 3, -4], dtype=torch.int32)
    packed = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    assert (packed.shape, packed.dtype) == ((16, 3), torch.int32)
    want = [[_word(row[j:j + 8]) for j in range(0, len(row), 8)] for row in w.tolist()]
    assert packed.cpu().tolist() == want
    assert packed.cpu()[0, 0].item() == _word([-8, 7, -1, 0, 1, -2, 3, -4])
    kernel, = [r for r in npugraph.trace.records if type(r).__name__ == "Kernel" and "int4pack" in r.op]
    assert kernel.cores.kind == "AICPU"


def test_values_outside_int4_keep_their_low_four_bits(npugraph):
    """torch_npu packs ``value & 0xF`` on the host without a range check."""
    w = torch.tensor([[9, -9, 16, 0, 0, 0, 0, 0]], dtype=torch.int32)
    assert torch_npu.npu_convert_weight_to_int4pack(w.npu()).cpu().item() == _word([9 - 16, -9 + 16, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("trans_weight", [False, True])
def test_the_packed_weight_feeds_weight_quant_batchmatmul(npugraph, trans_weight):
    """The wheel doc's example: a (k, n) weight, or an (n, k) one transposed after packing."""
    m, k, n = 4, 32, 16
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, k, generator=g).half()
    w = _weight(n, k, 2) if trans_weight else _weight(k, n, 2)
    scale, offset = torch.rand(1, n, generator=g).half() + 0.5, torch.randn(1, n, generator=g).half()
    packed = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    w_kn = w.T if trans_weight else w
    if trans_weight:
        packed = packed.transpose(-1, -2)
    y = torch_npu.npu_weight_quant_batchmatmul(x.npu(), packed, scale.npu(), offset.npu())
    want = x.float() @ ((w_kn.float() + offset.float()) * scale.float())
    torch.testing.assert_close(y.cpu().float(), want, rtol=2e-3, atol=2e-2)


def test_the_packed_weight_feeds_quant_matmul_transposed_as_w4a4_does(npugraph):
    """vLLM-Ascend W4A4: ``weight_packed = int4pack(weight (n, k))``, then ``npu_quant_matmul(x, weight_packed.t())``."""
    m, k, n = 3, 16, 8
    x_int, w = _weight(m, k, 3), _weight(n, k, 4)
    x_packed = torch_npu.npu_convert_weight_to_int4pack(x_int.npu())
    w_packed = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    y = torch_npu.npu_quant_matmul(x_packed, w_packed.t(), torch.ones(n).npu(), output_dtype=torch.int32)
    assert torch.equal(y.cpu(), (x_int.long() @ w.long().T).int())


def test_a_fractal_nz_weight_gives_a_fractal_nz_result(npugraph):
    nz = torch_npu.npu_format_cast(_weight().npu(), 29)
    assert torch_npu.get_npu_format(torch_npu.npu_convert_weight_to_int4pack(nz)) == 29
    assert torch_npu.get_npu_format(torch_npu.npu_convert_weight_to_int4pack(_weight().npu())) == 2


def test_meta_shape():
    out = torch.ops.npu.npu_convert_weight_to_int4pack(torch.empty(5, 64, dtype=torch.int32, device="meta"), 1)
    assert (out.shape, out.dtype) == ((5, 8), torch.int32)


@pytest.mark.parametrize("weight, message", [
    (torch.zeros(8, 16, dtype=torch.int32).T, "^weight should be contiguous$"),
    (torch.zeros(2, 8, 8, dtype=torch.int32), "^weight shape only support dim num 2, but it is 3$"),
    (torch.zeros(8, 16), "^weight dtype only support int32, but it is float$"),
    (torch.zeros(8, 16, dtype=torch.int64), "^weight dtype only support int32, but it is long int$"),
    (torch.zeros(0, 16, dtype=torch.int32), "^weight dim should be greater than 0$"),
    (torch.zeros(8, 12, dtype=torch.int32), "^weight last dim should be the multiple of 8, but it is 12$"),
])
def test_argument_errors_are_torch_npus(npugraph, weight, message):
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_convert_weight_to_int4pack(weight.npu() if weight.is_contiguous() else weight.T.npu().T)


def _w4a16(x, w, scale):
    packed = torch_npu.npu_convert_weight_to_int4pack(w, inner_k_tiles=1)
    return torch_npu.npu_weight_quant_batchmatmul(x, packed, scale) * 1, packed


@pytest.mark.parametrize("mode", ["ge", "npugraph_ex", "reduce-overhead"])
def test_a_compiled_pack_and_matmul_give_the_eager_values(npugraph, mode):
    x, w, scale = torch.randn(4, 16).half().npu(), _weight(16, 8, 5).npu(), (torch.rand(1, 8) + 0.5).half().npu()
    eager = [t.cpu() for t in _w4a16(x, w, scale)]
    step = torch.compile(_w4a16, backend=backend(mode), dynamic=False, fullgraph=True)
    for _ in range(2):
        for got, want in zip(step(x, w, scale), eager):
            assert torch.equal(got.cpu(), want)
