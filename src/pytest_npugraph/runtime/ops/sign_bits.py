"""1-bit Adam's sign packing: npu_sign_bits_pack and npu_sign_bits_unpack (torch_npu's docstrings).

* pack: a 1-D float tensor's signs, ``x >= 0`` -> bit 1, else 0, eight to a uint8 with the first value in the
  lowest bit; a length not divisible by 8 is padded with -1.0 (bit 0); the bytes are reshaped to ``(size, -1)``.
* unpack: the inverse: each bit of a 1-D uint8 tensor, lowest first, becomes +1.0 (bit 1) or -1.0 (bit 0) in
  ``dtype`` (float16 or float32), reshaped to ``(size, -1)``.
(vLLM-Ascend unpacks sign bits this way in its KV-cache compression path.)
"""
from __future__ import annotations

import torch

from ._common import _check, _dtype_of
from .spec import OpSpec, generated, vector

_SHIFTS = torch.arange(8, dtype=torch.int64)


def npu_sign_bits_pack(self, size):
    _check(self.dim() == 1, lambda: f"npu_sign_bits_pack: self must be 1-dimensional, but got {self.dim()} dims")
    _check(self.dtype in (torch.float16, torch.float32),
           lambda: f"npu_sign_bits_pack: self must be float16 or float32, but got {self.dtype}")
    n_bytes = -(-self.numel() // 8)
    _check(size > 0 and n_bytes % size == 0,
           lambda: f"npu_sign_bits_pack: size ({size}) must divide the packed length ({n_bytes})")
    bits = (self >= 0).to(torch.int64)
    bits = torch.nn.functional.pad(bits, (0, n_bytes * 8 - self.numel()))          # -1.0 padding: bit 0
    return (bits.reshape(n_bytes, 8) << _SHIFTS).sum(-1).to(torch.uint8).reshape(size, -1)


def npu_sign_bits_unpack(input, size, dtype):
    out_dtype = _dtype_of(dtype)
    _check(out_dtype in (torch.float16, torch.float32),
           lambda: f"npu_sign_bits_unpack: dtype must be torch.float16 or torch.float32, but got {dtype}")
    _check(input.dim() == 1 and input.dtype == torch.uint8,
           lambda: f"npu_sign_bits_unpack: input must be a 1-D uint8 tensor, but got {input.dtype} "
                   f"{list(input.shape)}")
    _check(size > 0 and input.numel() * 8 % size == 0,
           lambda: f"npu_sign_bits_unpack: size ({size}) must divide the unpacked length ({input.numel() * 8})")
    bits = (input.to(torch.int64).unsqueeze(-1) >> _SHIFTS) & 1
    return (bits * 2 - 1).reshape(size, -1).to(out_dtype)


SPECS = [
    OpSpec(generated("npu_sign_bits_pack"), npu_sign_bits_pack, vector(),
           meta=lambda self, size: self.new_empty((size, -(-self.numel() // 8) // size), dtype=torch.uint8)),
    OpSpec(generated("npu_sign_bits_unpack"), npu_sign_bits_unpack, vector(),
           meta=lambda input, size, dtype: input.new_empty((size, input.numel() * 8 // size),
                                                           dtype=_dtype_of(dtype))),
]
