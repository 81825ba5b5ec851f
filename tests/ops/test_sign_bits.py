"""npu_sign_bits_pack / npu_sign_bits_unpack: torch_npu's docstring examples, and bits read one at a time."""
from __future__ import annotations

import pytest
import torch

from pytest_npugraph.runtime.ops import sign_bits as S


def test_the_docstring_examples():
    a = torch.tensor([5, 4, 3, 2, 0, -1, -2, 4, 3, 2, 1, 0, -1, -2], dtype=torch.float32)
    assert S.npu_sign_bits_pack(a, 2).tolist() == [[159], [15]]
    b = S.npu_sign_bits_unpack(torch.tensor([159, 15], dtype=torch.uint8), 2, torch.float32)
    assert b.tolist() == [[1., 1., 1., 1., 1., -1., -1., 1.], [1., 1., 1., 1., -1., -1., -1., -1.]]


def test_unpack_reads_each_bit_lowest_first_and_pack_inverts_it():
    x = torch.randint(0, 256, (6,), dtype=torch.uint8)
    out = S.npu_sign_bits_unpack(x, 3, torch.float16)
    assert out.shape == (3, 16) and out.dtype == torch.float16
    flat = out.reshape(-1).tolist()
    for i, byte in enumerate(x.tolist()):
        for j in range(8):
            assert flat[8 * i + j] == (1.0 if (byte >> j) & 1 else -1.0)
    assert torch.equal(S.npu_sign_bits_pack(out.reshape(-1).float(), 3).reshape(-1), x)


def test_errors():
    with pytest.raises(RuntimeError, match="must divide the packed length"):
        S.npu_sign_bits_pack(torch.randn(16), 3)
    with pytest.raises(RuntimeError, match="dtype must be torch.float16 or torch.float32"):
        S.npu_sign_bits_unpack(torch.zeros(2, dtype=torch.uint8), 2, torch.int32)


def test_on_npu(npugraph):
    import torch_npu

    b = torch_npu.npu_sign_bits_unpack(torch.tensor([159, 15], dtype=torch.uint8).npu(), 2, torch.float32)
    assert b.cpu()[0].tolist() == [1., 1., 1., 1., 1., -1., -1., 1.]
    npugraph.assert_clean()
