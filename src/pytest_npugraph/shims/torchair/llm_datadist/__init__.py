"""``torchair.llm_datadist``: ``create_npu_tensors`` wraps device memory that LLM-DataDist allocated
(a KV-cache pool shared across a cluster) as NPU tensors.  The emulator has no LLM-DataDist cluster:
the arguments are checked as TorchAir checks them, then it raises ``pytest_npugraph.NotEmulated``
(a ``NotImplementedError``)."""
__all__ = ["create_npu_tensors"]

from typing import List

import torch

from pytest_npugraph.errors import NotEmulated


def _check_isinstance(arg_name, arg_value, classes, inner_class=None):
    if not isinstance(arg_value, classes):
        raise TypeError(f"{arg_name} only support {[c.__name__ for c in classes]}, but got {type(arg_value)}.")
    if inner_class is not None:
        for value in arg_value:
            if not isinstance(value, inner_class):
                raise TypeError(f"{arg_name} inner type only support {[inner_class]}, but got {type(value)}.")


def create_npu_tensors(shape: List[int], dtype: torch.dtype, addresses: List[int]) -> List[torch.Tensor]:
    _check_isinstance("shape", shape, (list, tuple), int)
    _check_isinstance("dtype", dtype, (torch.dtype,))
    _check_isinstance("addresses", addresses, (list, tuple), int)
    raise NotEmulated("pytest-npugraph does not emulate LLM-DataDist: torchair.llm_datadist.create_npu_tensors "
                      "wraps device memory of an LLM-DataDist cache (a cluster's KV-cache pool), which the "
                      "emulated device does not have")
