"""Sampling filters: npu_top_k_top_p (vLLM-Ascend's sampler calls ``npu_top_k_top_p(logits, p, k)``).

torch_npu 2.14.0's documented computation, per row b of 2-D logits:
ascending stable sort; the top-k threshold is the k[b]-th largest value and smaller values become
-inf; softmax of what is left; cumulative sum from the smallest probability; positions whose
cumulative probability is <= 1 - p[b] become -inf, except the largest element, which always stays;
then the values go back to their original positions.  Either filter alone when the other is None.
k must lie in [1, min(1024, vocab)] (the kernel does not check device data; out-of-range k is clamped here).
"""
from __future__ import annotations

import torch

from ._common import _check
from .spec import OpSpec, vector

_OP = "npu_top_k_top_p"



def npu_top_k_top_p(logits: torch.Tensor, p=None, k=None) -> torch.Tensor:
    """Filtered logits (-inf outside the kept set), same shape and dtype as ``logits``."""
    _check(p is not None or k is not None, f"{_OP}: p and k cannot both be None")
    _check(logits.dim() == 2, lambda: f"{_OP}: logits must be 2-dimensional, but got {logits.dim()}-dimensional")
    rows, vocab = logits.shape
    if k is not None:
        _check(k.dtype == torch.int32, lambda: f"{_OP}: k must be int32, but got {k.dtype}")
        _check(k.dim() == 1 and k.size(0) == rows, lambda: f"{_OP}: k must have shape [{rows}], "
                                                           f"but got {list(k.shape)}")
    if p is not None:
        _check(p.dim() == 1 and p.size(0) == rows, lambda: f"{_OP}: p must have shape [{rows}], "
                                                           f"but got {list(p.shape)}")
        _check(p.dtype == logits.dtype, lambda: f"{_OP}: p dtype {p.dtype} must match logits dtype {logits.dtype}")
    values, order = torch.sort(logits.float(), dim=-1, stable=True)
    neg_inf = torch.tensor(float("-inf"))
    if k is not None:
        # k outside [1, vocab] is undefined on the device (the kernel cannot check device data): clamp
        threshold = values.gather(-1, (vocab - k.to(torch.int64).clamp(1, vocab)).unsqueeze(-1))
        values = torch.where(values < threshold, neg_inf, values)
    if p is not None:
        cumulative = torch.softmax(values, dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - p.float()).unsqueeze(-1)
        drop[:, -1] = False
        values = torch.where(drop, neg_inf, values)
    out = torch.empty_like(values).scatter_(-1, order, values)
    return out.to(logits.dtype)


SPECS = [
    OpSpec("npu_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor", npu_top_k_top_p, vector(),
           meta=lambda logits, p=None, k=None: torch.empty_like(logits)),
]
