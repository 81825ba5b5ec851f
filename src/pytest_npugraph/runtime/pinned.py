"""Pinned (page-locked) host memory: ``pin_memory=True`` factories, ``Tensor.pin_memory()``, ``is_pinned()``.

torch asks the accelerator's C++ hooks for pinned memory: ``getPinnedMemoryAllocator`` when a CPU
factory gets ``pin_memory=True``, ``isPinnedPtr`` for ``is_pinned``.  A Python backend cannot supply
them: the hooks object a Python backend registers (``torch._C._acc.PrivateUse1Hooks``, through
``_setup_privateuseone_for_python_backend(hook=...)``) exposes only ``is_available``, ``is_built`` and
``has_primary_context``, so every pinned factory raises "You should register PrivateUse1HooksInterface
... and implement getPinnedMemoryAllocator".  Hence the Python surface is taken over instead: the
factories that take ``pin_memory`` (``torch.empty``/``zeros``/``ones``/``full``/``tensor``/``arange``...,
their ``*_like`` and ``Tensor.new_*`` forms) make an ordinary host tensor and mark its storage pinned;
``Tensor.pin_memory()`` makes a marked host copy (a pinned tensor is returned as it is);
``Tensor.is_pinned()`` reads the mark.  The mark lives on the storage's Python object (torch keeps it
alive with the storage), so views of a pinned tensor are pinned too, as on hardware.  Calls without
``pin_memory=True`` go straight to torch's functions.  Not covered: pinned memory made inside torch's
C++ (a DataLoader's pin thread uses ``Tensor.pin_memory``, so it is).
"""
from __future__ import annotations

import functools

import torch

_PINNED = "_npugraph_pinned"     # set on the (preserved) Python object of a pinned storage
_FACTORIES = ("empty", "empty_strided", "empty_like", "empty_permuted", "zeros", "zeros_like", "ones", "ones_like",
              "full", "full_like", "tensor", "arange", "range", "linspace", "logspace", "rand", "rand_like", "randn",
              "randn_like", "randint", "randint_like", "randperm", "eye", "scalar_tensor", "tril_indices",
              "triu_indices", "hann_window", "hamming_window", "bartlett_window", "blackman_window", "kaiser_window")
_METHODS = ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor")
_installed = False
_original = {}


def _mark(t: torch.Tensor) -> torch.Tensor:
    setattr(t.untyped_storage(), _PINNED, True)
    from .runtime import peek

    rt = peek()
    if rt is not None:       # torch_npu.npu.host_memory_stats(): the pinned allocator's counters
        stats = rt.extensions.setdefault("host_memory_stats", {})
        nbytes = t.untyped_storage().nbytes()
        stats["allocation.current"] = stats.get("allocation.current", 0) + 1
        stats["allocated_bytes.current"] = stats.get("allocated_bytes.current", 0) + nbytes
        stats["allocated_bytes.peak"] = max(stats.get("allocated_bytes.peak", 0), stats["allocated_bytes.current"])
    return t


def _pinned_factory(name: str, original):
    @functools.wraps(original)
    def factory(*args, pin_memory=False, **kwargs):
        if not pin_memory:
            return original(*args, **kwargs)
        out = original(*args, **kwargs)
        if out.device.type != "cpu":
            raise RuntimeError("Only dense CPU tensors can be pinned")
        return _mark(out)
    factory._npugraph_pinned_factory = True
    return factory


def _pinned_method(name: str, original):
    @functools.wraps(original)
    def method(self, *args, pin_memory=False, **kwargs):
        if not pin_memory:
            return original(self, *args, **kwargs)
        out = original(self, *args, **kwargs)
        if out.device.type != "cpu":
            raise RuntimeError("Only dense CPU tensors can be pinned")
        return _mark(out)
    method._npugraph_pinned_factory = True
    return method


def pin_memory(self, device=None):
    """``Tensor.pin_memory``: a page-locked host copy (marked, so ``is_pinned()`` says True)."""
    if self.device.type != "cpu" or self.layout != torch.strided:
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    if is_pinned(self):
        return self
    out = torch.empty(self.shape, dtype=self.dtype)
    out.copy_(self)
    return _mark(out)


def is_pinned(self, device=None) -> bool:
    """``Tensor.is_pinned``: whether the tensor's host storage was allocated pinned."""
    if self.device.type != "cpu" or self.layout != torch.strided or self.numel() == 0:
        return False
    return bool(getattr(self.untyped_storage(), _PINNED, False))


def install() -> None:
    """Once per process (``backend.install``): the pinned factories and Tensor methods."""
    global _installed
    if _installed:
        return
    for name in _FACTORIES:
        original = getattr(torch, name, None)
        if original is not None and not getattr(original, "_npugraph_pinned_factory", False):
            _original[name] = original
            wrapper = _pinned_factory(name, original)
            setattr(torch, name, wrapper)
            op = torch.jit._builtins._find_builtin(original)
            if op is not None:       # TorchScript resolves torch.<name> by identity: the wrapper is the same op
                torch.jit._builtins._register_builtin(wrapper, op)
    for name in _METHODS:
        original = getattr(torch.Tensor, name, None)
        if original is not None and not getattr(original, "_npugraph_pinned_factory", False):
            _original["Tensor." + name] = original
            setattr(torch.Tensor, name, _pinned_method(name, original))
    pin_memory.__doc__ = torch.Tensor.pin_memory.__doc__
    is_pinned.__doc__ = torch.Tensor.is_pinned.__doc__
    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned
    _installed = True
