"""The legacy tensor types ``torch.npu.FloatTensor`` and friends: ``isinstance`` checks against an
npu tensor's dtype, and constructors (``torch.npu.FloatTensor(2, 3)``, ``torch.npu.FloatTensor([1, 2])``)."""
from __future__ import annotations

import torch

_TYPES = (("BoolTensor", torch.bool), ("ByteTensor", torch.uint8), ("CharTensor", torch.int8),
          ("ShortTensor", torch.int16), ("IntTensor", torch.int32), ("LongTensor", torch.int64),
          ("HalfTensor", torch.float16), ("FloatTensor", torch.float32), ("DoubleTensor", torch.float64),
          ("BFloat16Tensor", torch.bfloat16))


class _TensorType(type):
    dtype: torch.dtype

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype

    def __call__(cls, *args, device=None):
        device = torch.device("npu") if device is None else torch.device(device)
        if device.type != "npu":
            raise RuntimeError(f"legacy constructor expects device type: npu but device type: {device.type} was passed")
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            t = args[0]
            if not isinstance(t, cls):
                raise TypeError(f"expected torch.npu.{cls.__name__} (got {t.type()})")
            return t
        if len(args) == 1 and isinstance(args[0], torch.Size):
            args = tuple(args[0])
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args, dtype=cls.dtype, device=device)
        if len(args) == 1:
            return torch.tensor(args[0], dtype=cls.dtype, device=device)
        raise TypeError(f"new(): invalid arguments for torch.npu.{cls.__name__}: "
                        f"({', '.join(type(a).__name__ for a in args)})")

    def __repr__(cls) -> str:
        return f"<class 'torch.npu.{cls.__name__}'>"


def _make(name: str, dtype: torch.dtype):
    return _TensorType(name, (), {"dtype": dtype, "is_npu": True, "__module__": "torch.npu"})


for _name, _dtype in _TYPES:
    globals()[_name] = _make(_name, _dtype)

__all__ = [name for name, _ in _TYPES]


def _patch_tensor_type() -> None:
    """``x.type(torch.npu.HalfTensor)``: torch reads a type argument's C type name, which for the
    real package's C-made types is ``"torch.npu.HalfTensor"``; ours are Python classes, so pass the
    name torch parses."""
    original = torch.Tensor.type
    if getattr(original, "_npugraph", False):
        return

    def type(self, dtype=None, non_blocking=False, **kwargs):  # noqa: A001 - torch's method name
        if isinstance(dtype, _TensorType):
            dtype = f"torch.npu.{dtype.__name__}"
        if dtype is None and not kwargs and non_blocking is False:
            return original(self)
        return original(self, dtype, non_blocking, **kwargs)

    type.__doc__ = original.__doc__
    type._npugraph = True
    torch.Tensor.type = type


_patch_tensor_type()
