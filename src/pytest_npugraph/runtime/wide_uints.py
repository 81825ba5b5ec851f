"""uint16, uint32 and uint64 on the NPU: which ops take them, and torch_npu's error for the rest.

Why: CPU torch computes some ops on these dtypes (``mul``, ``cat``, ``sum``, ``randint``...) and lacks
others (``add``), while the Ascend kernels of the chips emulated (Atlas A2 / A3: 910B, 910_93) take
them in a few data-movement ops only.  Model code that works here on a wide uint would then fail on
the device, and code that fails here would fail with CPU torch's ``NotImplementedError`` instead of
torch_npu's ``RuntimeError``.

Evidence (CANN ops-math docs, ``hicann/ops-math``, ``<op>/docs/aclnn<Name>.md``, the A2/A3 rows and
their ``npu="A3,910b"`` notes):

* all three: ``aclnnCast`` (``.to``), ``aclnnInplaceCopy`` (copies, ``clone``, ``contiguous``),
  ``aclnnInplaceFillScalar``/``FillTensor``, ``aclnnSWhere``, ``aclnnStack``, ``aclnnRepeat``,
  ``aclnnConstantPadNd``, ``aclnnEqual`` (``torch.equal``);
* uint16 only: ``aclnnInplaceZero`` (``zeros``, ``zero_``), ``aclnnInplaceOne`` (``ones``),
  ``aclnnBitwiseAndTensor``;
* none on A2/A3, said outright: ``aclnnCat``, ``aclnnSort``/``Argsort``, ``aclnnTopk``; ``aclnnAdds``
  lists no uint wider than 8 bits, and torch_npu's error for ``x + 1`` on a uint64 tensor is
  ``call aclnnAdds failed, error code is 161002 ... EZ1001: Tensor self not implemented for DT_UINT64,
  should be in dtype support list [...]`` (Ascend/pytorch issue 158, where ``torch.randint(...,
  dtype=torch.uint64, device="npu")`` fails with ``self scalar_type:UInt64is not surpported.``).

Allocating (``empty``), views and host/device transfers run no kernel and take any dtype.  Every other
op given a wide uint tensor (an input, an output, or its ``dtype=``) raises torch_npu's error.
"""
from __future__ import annotations

import torch

from .errors import ErrCode, ops_error, pta_error

WIDE = frozenset((torch.uint16, torch.uint32, torch.uint64))
_U16 = frozenset((torch.uint16,))

# aten op -> the wide uints its A2/A3 kernel takes (see the module docstring)
_TAKES = {
    "aten::_to_copy": WIDE, "aten::copy_": WIDE, "aten::_copy_from": WIDE, "aten::_copy_from_and_resize": WIDE,
    "aten::clone": WIDE, "aten::contiguous": WIDE,
    "aten::fill_": WIDE, "aten::fill": WIDE, "aten::full": WIDE, "aten::full_like": WIDE, "aten::new_full": WIDE,
    "aten::where": WIDE, "aten::stack": WIDE, "aten::repeat": WIDE, "aten::constant_pad_nd": WIDE,
    "aten::equal": WIDE,
    # no kernel: allocation, a device-to-host read of one value
    "aten::empty": WIDE, "aten::empty_strided": WIDE, "aten::lift_fresh_copy": WIDE,
    "aten::_local_scalar_dense": WIDE,
    "aten::zero_": _U16, "aten::zeros": _U16, "aten::zeros_like": _U16, "aten::new_zeros": _U16,
    "aten::ones": _U16, "aten::ones_like": _U16, "aten::new_ones": _U16,
    "aten::bitwise_and": _U16, "aten::bitwise_and_": _U16, "aten::__and__": _U16, "aten::__iand__": _U16,
}

# random ops: torch_npu refuses the dtype before any kernel ("self scalar_type:<T>is not surpported.")
_RANDOM = frozenset(("aten::random_", "aten::randint", "aten::randint_like", "aten::randperm"))

_ACL_NAMES = {torch.uint16: "DT_UINT16", torch.uint32: "DT_UINT32", torch.uint64: "DT_UINT64"}
_SCALAR_NAMES = {torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64"}
# aclnnAdd/Adds' list (docs/aclnnAdds.md), in torch_npu's message order
_ADD_LIST = "[DT_FLOAT,DT_INT32,DT_INT64,DT_FLOAT16,DT_INT16,DT_INT8,DT_UINT8,DT_DOUBLE,DT_BOOL,DT_BFLOAT16," \
            "DT_COMPLEX64,DT_COMPLEX128,]"


def taken(name: str) -> frozenset:
    """The wide uints the NPU kernel of aten op ``name`` (``schema.name``) takes."""
    return _TAKES.get(name, frozenset())


def refuse(name: str, taken_here: frozenset, inputs, kwargs) -> None:
    """torch_npu's error if an NPU tensor of ``inputs`` or the ``dtype=`` of ``kwargs`` is a wide uint
    the op's kernel does not take (``name`` is the op's ``schema.name``)."""
    dtype = None
    for t in inputs:
        if t.dtype in WIDE and t.dtype not in taken_here:
            dtype = t.dtype
            break
    if dtype is None and kwargs:
        wanted = kwargs.get("dtype")
        if wanted in WIDE and wanted not in taken_here:
            dtype = wanted
    if dtype is None:
        return
    if name in _RANDOM:
        raise RuntimeError(f"self scalar_type:{_SCALAR_NAMES[dtype]}is not surpported." + ops_error(ErrCode.TYPE))
    short = name.split("::")[-1]
    if short.startswith("add"):
        kernel, support = "aclnnAdds" if _scalar_other(inputs) else "aclnnAdd", f", should be in dtype support list {_ADD_LIST}"
    else:
        kernel, support = f"aclnn kernel of {short}", " on Atlas A2/A3 (it takes uint16/uint32/uint64 only in casts, " \
                                                        "copies, fills, where, stack, repeat and padding)"
    raise RuntimeError(f"{short}: NPU function error: call {kernel} failed, error code is 161002"
                       + pta_error(ErrCode.ACL)
                       + f"\nAclNN_Parameter_Error(EZ1001): Tensor self not implemented for {_ACL_NAMES[dtype]}{support}.")


def _scalar_other(inputs) -> bool:
    return len(inputs) == 1
