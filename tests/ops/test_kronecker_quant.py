"""``npu_kronecker_quant`` (FlatQuant): ``P1 @ x @ P2`` per slice, per-slice int4 quantisation, eight
nibbles per int32, as vLLM-Ascend's W4A4 FlatQuant linear calls it before ``npu_quant_matmul``.

The independent computation: the rotation through the Kronecker product (``vec(P1 X P2) = (P1 kron P2^T)
vec(X)`` for row-major vec), the quantisation element by element in Python, and the unpacking by bit
arithmetic on Python ints."""
from __future__ import annotations

import math

import pytest
import torch

import torch_npu
from graph.helpers import backend

K, M, N = 5, 3, 16


def _inputs(seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(K, M, N, generator=g).to(dtype), (torch.randn(M, M, generator=g) / 2).to(dtype),
            (torch.randn(N, N, generator=g) / 4).to(dtype))


def _nibbles(word: int):
    """The eight signed 4-bit values of an int32, lowest nibble first."""
    word &= 0xFFFFFFFF
    return [((word >> (4 * i)) & 0xF) - (16 if (word >> (4 * i)) & 0x8 else 0) for i in range(8)]


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    rows = [[v for w in row for v in _nibbles(w)] for row in packed.reshape(-1, packed.size(-1)).tolist()]
    return torch.tensor(rows).reshape(*packed.shape[:-1], packed.size(-1) * 8)


def _expected(x, p1, p2, clip):
    kron = torch.kron(p1.double(), p2.double().T.contiguous())                    # (M*N, M*N)
    rotated = (x.double().reshape(K, M * N) @ kron.T).reshape(K, M, N)
    values, scales = [], []
    for k in range(K):
        flat = rotated[k].reshape(-1).tolist()
        scale = max(abs(v) for v in flat) * clip / 7
        scales.append(scale)
        values.append([max(-8, min(7, round(v / scale))) for v in flat])
    return torch.tensor(values).reshape(K, M, N), torch.tensor(scales, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("clip", [1.0, 0.7848])
def test_quantised_values_and_scales_match_the_kronecker_computation(npugraph, dtype, clip):
    x, p1, p2 = _inputs(dtype=dtype)
    out, scale = torch_npu.npu_kronecker_quant(x.npu(), p1.npu(), p2.npu(), clip_ratio=clip, dst_dtype=torch.int32)
    assert (out.shape, out.dtype, scale.shape, scale.dtype) == ((K, M, N // 8), torch.int32, (K,), torch.float32)
    want_q, want_scale = _expected(x, p1, p2, clip)
    torch.testing.assert_close(scale.cpu().double(), want_scale, rtol=1e-5, atol=0)
    got = _unpack(out.cpu())
    assert (got - want_q).abs().max() <= 1                 # float32 vs float64 at a rounding boundary
    assert (got != want_q).float().mean() < 0.02
    if clip < 1:
        assert got.max() == 7 or got.min() == -8           # clip_ratio < 1 saturates the largest values


def test_defaults_are_clip_ratio_1_and_int32(npugraph):
    x, p1, p2 = _inputs(1)
    out, scale = torch_npu.npu_kronecker_quant(x.npu(), p1.npu(), p2.npu())
    same, same_scale = torch_npu.npu_kronecker_quant(x.npu(), p1.npu(), p2.npu(), 1.0, 3)
    assert torch.equal(out.cpu(), same.cpu()) and torch.equal(scale.cpu(), same_scale.cpu())
    assert _unpack(out.cpu()).abs().max() == 7             # the largest value of each slice maps to +-7


def test_the_output_feeds_npu_quant_matmul_as_vllm_ascend_flatquant_does(npugraph):
    """``x_q.view(-1, M*N // 8)`` with ``pertoken_scale=quant_scale`` against int4 weights."""
    x, p1, p2 = _inputs(2)
    g = torch.Generator().manual_seed(3)
    w_int = torch.randint(-8, 8, (M * N, 8), generator=g)
    w_scale = torch.rand(8, generator=g) + 0.5
    out, scale = torch_npu.npu_kronecker_quant(x.npu(), p1.npu(), p2.npu(), clip_ratio=1.0)
    w_packed = torch_npu.npu_quantize(w_int.float().npu(), torch.ones(1).npu(), None, torch.quint4x2, -1, False)
    y = torch_npu.npu_quant_matmul(out.view(-1, M * N // 8), w_packed, w_scale.npu(), pertoken_scale=scale,
                                   output_dtype=torch.float16)
    x_q = _unpack(out.cpu()).reshape(K, M * N).double()
    want = (x_q @ w_int.double()) * w_scale.double() * scale.cpu().double().unsqueeze(-1)
    torch.testing.assert_close(y.cpu().double(), want, rtol=2e-3, atol=2e-3)


def test_meta_shapes():
    x = torch.empty(7, 4, 32, dtype=torch.bfloat16, device="meta")
    p1, p2 = torch.empty(4, 4, dtype=torch.bfloat16, device="meta"), torch.empty(32, 32, dtype=torch.bfloat16,
                                                                                  device="meta")
    out, scale = torch.ops.npu.npu_kronecker_quant(x, p1, p2, 0.5)
    assert (out.shape, out.dtype, scale.shape, scale.dtype) == ((7, 4, 4), torch.int32, (7,), torch.float32)
    y, s = torch.ops.npu.npu_kronecker_quant(x, p1, p2, dst_dtype=296)      # mxfp4: the wheel's meta shapes
    assert (y.shape, y.dtype, s.shape, s.dtype) == ((7, 64), torch.uint8, (7, 2, 2), torch.uint8)


@pytest.mark.parametrize("change, error, message", [
    (dict(dst_dtype=1), RuntimeError, "^the dtype of dst_dtype must be int32, or mxfp4$"),
    (dict(x=torch.zeros(K, M, 12, dtype=torch.float16), p2=torch.zeros(12, 12, dtype=torch.float16)),
     RuntimeError, "^last dim of input x must be divisible by 8$"),
    (dict(x=torch.zeros(K, M, N)), RuntimeError, "x dtype must be float16 or bfloat16"),
    (dict(p1=torch.zeros(M, M, dtype=torch.bfloat16)), RuntimeError, "must have x's dtype"),
    (dict(p2=torch.zeros(8, 8, dtype=torch.float16)), RuntimeError, r"kronecker_p2 must be \[N, N\]"),
    (dict(clip_ratio=1.5), RuntimeError, r"clip_ratio must be in \(0, 1\]"),
    (dict(dst_dtype=296, x=torch.zeros(K, M, 15, dtype=torch.float16), p2=torch.zeros(15, 15, dtype=torch.float16)),
     RuntimeError, "last dim of x must be even"),
])
def test_argument_errors(npugraph, change, error, message):
    x, p1, p2 = _inputs()
    args = dict(x=x, p1=p1, p2=p2, clip_ratio=1.0, dst_dtype=None)
    args.update(change)
    with pytest.raises(error, match=message):
        torch_npu.npu_kronecker_quant(args["x"].npu(), args["p1"].npu(), args["p2"].npu(),
                                      clip_ratio=args["clip_ratio"], dst_dtype=args["dst_dtype"])


def test_mxfp4_dst_type_max_is_refused_clearly(npugraph):
    x, p1, p2 = _inputs()
    with pytest.raises(NotImplementedError, match="dst_type_max"):
        torch_npu.npu_kronecker_quant(x.npu(), p1.npu(), p2.npu(), dst_dtype=296, dst_type_max=6.0)


def _e2m1(code: int) -> float:
    """FP4 E2M1 from its bits: sign, 2 exponent bits (bias 1), 1 mantissa bit."""
    exp, man = (code >> 1) & 3, code & 1
    value = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
    return -value if code & 8 else value


@pytest.mark.parametrize("right", [True, False], ids=["P1 x P2", "P2 [0, 0]: left only"])
def test_mxfp4_output_is_mx_quantised_in_groups_of_32(npugraph, right):
    """vLLM-Ascend's W4A4 MXFP4 FlatQuant: ``dst_dtype=torch_npu.float4_e2m1fn_x2``; aclnnFlatQuant's pergroup mode."""
    x, p1, p2 = _inputs(6)
    x = torch.cat([x, x * 40], dim=0)                                  # slices of different magnitude
    k = x.size(0)
    p2_arg = p2 if right else torch.empty(0, 0, dtype=p2.dtype)
    out, scale = torch_npu.npu_kronecker_quant(x.npu(), p1.npu(), p2_arg.npu(), 0.5, 296)
    assert (out.shape, out.dtype, scale.shape, scale.dtype) == ((k, M * N // 2), torch.uint8, (k, 1, 2), torch.uint8)
    p2_eff = p2.double() if right else torch.eye(N, dtype=torch.float64)
    kron = torch.kron(p1.double(), p2_eff.T.contiguous())
    rotated = x.double().reshape(k, M * N) @ kron.T
    grid = sorted({abs(_e2m1(c)) for c in range(8)})
    for r in range(k):
        codes = [c for byte in out.cpu()[r].tolist() for c in (byte & 0xF, byte >> 4)]
        for g in range(0, M * N, 32):
            group = rotated[r, g:g + 32].tolist()
            shared = math.frexp(max(abs(v) for v in group))[1] - 1 - 2    # floor(log2(amax)) - emax(E2M1)
            assert scale.cpu()[r].reshape(-1)[g // 32].item() == shared + 127
            for v, c in zip(group, codes[g:g + 32]):
                target = min(6.0, abs(v) / 2.0 ** shared)                  # saturates at E2M1's 6
                best = min(abs(q - target) for q in grid)
                assert abs(abs(_e2m1(c)) - target) <= best + 1e-5          # a nearest E2M1 value (float32 ties)
                assert _e2m1(c) == 0 or (_e2m1(c) < 0) == (v < 0)


def _flatquant(x, p1, p2):
    q, scale = torch_npu.npu_kronecker_quant(x.view(-1, M, N), p1, p2, clip_ratio=0.9, dst_dtype=torch.int32)
    q4, scale4 = torch_npu.npu_kronecker_quant(x.view(-1, M, N), p1, p2, 1.0, dst_dtype=296)
    return q.view(-1, M * N // 8), scale * 1.0, q4 + 0, scale4 + 0


@pytest.mark.parametrize("mode", ["ge", "npugraph_ex", "reduce-overhead"])
def test_a_compiled_flatquant_gives_the_eager_values(npugraph, mode):
    x, p1, p2 = _inputs(4)
    args = (x.reshape(K, M * N).npu(), p1.npu(), p2.npu())
    eager = [t.cpu() for t in _flatquant(*args)]
    step = torch.compile(_flatquant, backend=backend(mode), dynamic=False, fullgraph=True)
    for _ in range(2):
        for got, want in zip(step(*args), eager):
            assert torch.equal(got.cpu(), want)
