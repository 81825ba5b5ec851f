"""``npu_dynamic_mx_quant``: OCP MX quantisation to FP8 / FP4 with E8M0 block scales, as vLLM-Ascend's
Ascend 950 paths call it (``dst_type=torch.float8_e4m3fn`` before ``npu_mla_prolog_v3``, MXFP4/MXFP8 MoE).

Independent checks: the CANN doc's worked example (exact bytes); a per-block Python computation of the
scale with ``math.frexp``; each quantised value against the nearest representable value found by brute
force over every code of the destination format, decoded from its bit fields (ties to the even code);
the pairing of scales along a non-last axis by explicit indexing."""
from __future__ import annotations

import math

import pytest
import torch

import torch_npu
from graph.helpers import backend

EMAX = {24: 8, 23: 15, 296: 2, 297: 0}


def _fp4_value(code: int, dst: int) -> float:
    """Decode a 4-bit code: sign bit 3; E2M1 = 2 exponent bits (bias 1) + 1 mantissa bit, E1M2 = 1 + 2."""
    sign = -1.0 if code & 8 else 1.0
    mbits = 1 if dst == 296 else 2
    exp, man = (code & 7) >> mbits, code & ((1 << mbits) - 1)
    value = man / (1 << mbits) if exp == 0 else 2.0 ** (exp - 1) * (1 + man / (1 << mbits))
    return sign * value


def _codes(dst: int):
    """(code, value) of every finite code of the destination format."""
    if dst in (296, 297):
        return [(c, _fp4_value(c, dst)) for c in range(16)]
    fp8 = torch.float8_e4m3fn if dst == 24 else torch.float8_e5m2
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float().tolist()
    return [(c, v) for c, v in enumerate(values) if math.isfinite(v)]


def _nearest_code(v: float, dst: int) -> int:
    """Round to nearest, ties to the even code, saturating; a zero result keeps v's sign (IEEE)."""
    table = _codes(dst)
    top = max(val for _, val in table)
    v = max(-top, min(top, v))
    best = min(abs(val - v) for _, val in table)
    ties = [c for c, val in table if abs(val - v) == best]
    if _value(ties[0], dst) == 0:
        return next(c for c in ties if (c >= (8 if dst in (296, 297) else 128)) == (math.copysign(1, v) < 0))
    even = [c for c in ties if c % 2 == 0]
    return (even or ties)[0]


def _value(code: int, dst: int) -> float:
    return dict(_codes(dst))[code]


def _expected_block(values, dst, block_size=32):
    """Per block: (scale byte, [quantised codes])."""
    out_bytes, out_codes = [], []
    for start in range(0, len(values), block_size):
        block = values[start:start + block_size]
        amax = max(abs(v) for v in block)
        if amax == 0:
            shared = -127
        else:
            shared = math.frexp(amax)[1] - 1 - EMAX[dst]      # floor(log2(amax)) - emax
        out_bytes.append(shared + 127)
        out_codes += [_nearest_code(v / 2.0 ** shared, dst) for v in block]
    return out_bytes, out_codes


def _fp8_codes(y: torch.Tensor):
    return y.view(torch.uint8).reshape(-1).tolist()


def _fp4_codes(y: torch.Tensor):
    return [c for byte in y.reshape(-1).tolist() for c in (byte & 0xF, byte >> 4)]


def test_the_cann_doc_example_bytes(npugraph):
    x = torch.tensor([[0.0, 8.0, 64.0, 512.0]], dtype=torch.bfloat16)
    y, scale = torch_npu.npu_dynamic_mx_quant(x.npu(), dst_type=torch.float8_e4m3fn)
    assert y.dtype == torch.float8_e4m3fn and _fp8_codes(y.cpu()) == [0, 72, 96, 120]
    assert scale.dtype == torch.uint8 and scale.cpu().tolist() == [[[128, 0]]]


@pytest.mark.parametrize("dst", [24, 23, 292, 291])
def test_fp8_values_and_scales_match_the_per_block_computation(npugraph, dst):
    g = torch.Generator().manual_seed(dst)
    x = (torch.randn(3, 96, generator=g) * torch.tensor([0.01, 3.0, 500.0]).repeat_interleave(32)).bfloat16()
    x[1, 32:64] = 0                                           # an all-zero block
    y, scale = torch_npu.npu_dynamic_mx_quant(x.npu(), dst_type=dst)
    code = {292: 24, 291: 23}.get(dst, dst)
    assert y.dtype == (torch.float8_e4m3fn if code == 24 else torch.float8_e5m2)
    assert scale.shape == (3, 2, 2)
    for r in range(3):
        want_bytes, want_codes = _expected_block(x[r].float().tolist(), code)
        assert scale.cpu()[r].reshape(-1).tolist()[:3] == want_bytes and scale.cpu()[r, 1, 1] == 0   # pad
        assert _fp8_codes(y.cpu()[r]) == want_codes


@pytest.mark.parametrize("dst", [296, 297])
def test_fp4_values_are_packed_two_per_byte_low_nibble_first(npugraph, dst):
    g = torch.Generator().manual_seed(dst)
    x = (torch.randn(2, 64, generator=g) * 3).half()
    x[0, :8] = torch.tensor([6.0, -6.0, 5.0, -5.0, 0.75, 2.5, 0.25, -0.1])   # ties, the block max, -0
    y, scale = torch_npu.npu_dynamic_mx_quant(x.npu(), dst_type=dst)
    assert (y.shape, y.dtype, scale.shape) == ((2, 32), torch.uint8, (2, 1, 2))
    for r in range(2):
        want_bytes, want_codes = _expected_block(x[r].float().tolist(), dst)
        assert scale.cpu()[r].reshape(-1).tolist() == want_bytes
        assert _fp4_codes(y.cpu()[r]) == want_codes


def test_dequantised_values_are_within_half_a_step_or_saturated(npugraph):
    """OCP scales leave the block max in [2**emax, 2**(emax+1)): above E4M3's 448 it saturates."""
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(6)).bfloat16()
    y, scale = torch_npu.npu_dynamic_mx_quant(x.npu(), dst_type=torch.float8_e4m3fn)
    scales = torch.exp2(scale.cpu().reshape(4, -1)[:, :4].float() - 127).repeat_interleave(32, dim=1)
    back, xf = y.cpu().float() * scales, x.float()
    saturated = (xf / scales).abs() > 448
    assert saturated.any() and torch.equal(back[saturated], xf[saturated].sign() * 448 * scales[saturated])
    ok = (back - xf).abs() <= xf.abs() * 2 ** -4 + scales * 2 ** -10
    assert ok[~saturated].all()


def test_a_non_last_axis_pairs_the_scales_of_consecutive_blocks(npugraph):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(160, 3, 4, generator=g) * torch.rand(160, 1, 1, generator=g) * 50).bfloat16()   # 5 blocks
    y, scale = torch_npu.npu_dynamic_mx_quant(x.npu(), axis=0, dst_type=torch.float8_e5m2)
    assert (y.shape, scale.shape) == ((160, 3, 4), (3, 3, 4, 2))
    scale = scale.cpu()
    for i in range(3):
        for j in range(4):
            want_bytes, want_codes = _expected_block(x[:, i, j].float().tolist(), 23)
            got = [scale[p, i, j, t].item() for p in range(3) for t in range(2)]
            assert got == want_bytes + [0]                   # block 2p + t, the odd count padded with 0
            assert _fp8_codes(y.cpu()[:, i, j].contiguous()) == want_codes


def test_scale_alg_1_rounds_amax_over_the_dtype_max_up_to_a_power_of_two(npugraph):
    x = torch.tensor([[448.0 * 3] + [1.0] * 31, [0.001] * 32], dtype=torch.float32)
    y, scale = torch_npu.npu_dynamic_mx_quant(x.npu(), dst_type=torch.float8_e4m3fn, scale_alg=1, max_low_bound=0.5)
    # block 0: S = 3 -> 4 (byte 129); block 1: amax raised to 0.5 -> S = 0.5/448 -> 2**-9 (byte 118)
    assert scale.cpu()[:, 0, 0].tolist() == [129, 118]
    # 1344 / 4 = 336 lies halfway between 320 and 352: the even mantissa (320); 0.001 * 2**9 = 0.512 -> 0.5
    assert y.cpu().float()[0, 0].item() == 320.0 and y.cpu().float()[1, 0].item() == 0.5


def test_vllm_ascends_mla_decode_call(npugraph):
    """``npu_dynamic_mx_quant(hidden_states[:bsz].unsqueeze(1), dst_type=torch.float8_e4m3fn)`` then reshape."""
    hidden = torch.randn(4, 256).bfloat16().npu()
    y, dynamic_scale = torch_npu.npu_dynamic_mx_quant(hidden.unsqueeze(1), dst_type=torch.float8_e4m3fn)
    assert (y.shape, dynamic_scale.shape) == ((4, 1, 256), (4, 1, 4, 2))
    assert dynamic_scale.reshape(y.shape[0] * y.shape[1], -1).shape == (4, 8)


def test_meta_shapes():
    x = torch.empty(2, 5, 100, dtype=torch.bfloat16, device="meta")
    y, s = torch.ops.npu.npu_dynamic_mx_quant(x)
    assert (y.shape, y.dtype, s.shape, s.dtype) == ((2, 5, 50), torch.uint8, (2, 5, 2, 2), torch.uint8)
    y, s = torch.ops.npu.npu_dynamic_mx_quant(x, axis=1, dst_type=292, block_size=64)
    assert (y.shape, y.dtype, s.shape) == ((2, 5, 100), torch.float8_e4m3fn, (2, 1, 100, 2))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(axis=2), RuntimeError, r"^Parameter axis is out of input dimension range \[-2, 1\]$"),
    (dict(block_size=48), RuntimeError, "^Parameter block_size must be divisible by 32 and no greater than 1024"),
    (dict(scale_alg=3), RuntimeError, r"^Invalid scale_alg value: \{scale_alg\}. Expected 0 or 1.$"),
    (dict(dst_type=296, x=torch.zeros(2, 63)), RuntimeError, "the last dim of input must be divisible by 2, $"),
    (dict(dst_type=24, round_mode="floor"), RuntimeError, "round_mode 'floor' is not supported"),
    (dict(dst_type=297, scale_alg=1), RuntimeError, "scale_alg 1 is not supported"),
    (dict(dst_type=1), RuntimeError, "dst_type 1 is not supported"),
    (dict(max_low_bound=1.0), RuntimeError, "max_low_bound must be non-negative, and 0.0 unless scale_alg is 1"),
    (dict(x=torch.zeros(2, 64), block_size=64), RuntimeError, "float32 input needs block_size 32"),
    (dict(scale_alg=2), NotImplementedError, "scale_alg=2"),
])
def test_argument_errors(npugraph, kwargs, error, message):
    x = kwargs.pop("x", torch.zeros(2, 64, dtype=torch.float16))
    with pytest.raises(error, match=message):
        torch_npu.npu_dynamic_mx_quant(x.npu(), **kwargs)


def _quant_both(x):
    y8, s8 = torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn)
    y4, s4 = torch_npu.npu_dynamic_mx_quant(x, axis=0, round_mode="round")
    return y8.view(torch.uint8) + 0, s8 + 0, y4 + 0, s4 + 0


@pytest.mark.parametrize("mode", ["ge", "npugraph_ex", "reduce-overhead"])
def test_compiled_quantisation_gives_the_eager_values(npugraph, mode):
    x = (torch.randn(64, 64) * 4).bfloat16().npu()
    eager = [t.cpu() for t in _quant_both(x)]
    step = torch.compile(_quant_both, backend=backend(mode), dynamic=False, fullgraph=True)
    for _ in range(2):
        for got, want in zip(step(x), eager):
            assert torch.equal(got.cpu(), want)
