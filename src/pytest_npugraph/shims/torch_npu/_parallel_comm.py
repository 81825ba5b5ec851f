"""``torch._C._broadcast``/``_broadcast_coalesced``/``_scatter``/``_gather`` (and their ``_out`` forms) for
NPU tensors, as torch_npu adds them: what ``torch.nn.parallel.comm`` and ``DataParallel`` call.

Why: a CPU build of torch has none of them (they are CUDA's), so ``DataParallel`` and
``nn.parallel.comm`` fail on ``npu`` devices without them.  Each is made of device copies, recorded
as the emulator records any copy (``Tensor.to``: a device-to-device copy is ordered with both
devices' current streams, as torch's peer copy; ``_scatter``'s ``streams`` are made current for
theirs), so work on another stream that reads a copy unordered is a race.
"""
from __future__ import annotations

import contextlib

import torch


def _device(index: int) -> torch.device:
    return torch.device("cpu") if index == -1 else torch.device("npu", index)


def _on(stream):
    return torch.npu.stream(stream) if stream is not None else contextlib.nullcontext()


def _check_npu(tensor, what: str) -> None:
    if tensor.device.type != "npu":
        raise RuntimeError(f"{what}: expected an npu tensor, got one on {tensor.device}")


def _to(tensor, index: int, stream=None):
    """``tensor`` on device ``index`` (-1: the CPU); itself if it is there."""
    target = _device(index)
    if tensor.device == target:
        return tensor
    with _on(stream):
        return tensor.to(target, non_blocking=target.type != "cpu")


def _broadcast(tensor, devices):
    """``tensor`` on each of ``devices`` (itself on its own device)."""
    _check_npu(tensor, "broadcast")
    return [_to(tensor, d) for d in devices]


def _broadcast_out(tensor, out):
    _check_npu(tensor, "broadcast")
    for o in out:
        if o.shape != tensor.shape:
            raise RuntimeError(f"output tensor must have the same shape as the input, got {tuple(o.shape)} and "
                               f"{tuple(tensor.shape)}")
        if o is not tensor:
            o.copy_(_to(tensor, o.device.index))
    return out


def _broadcast_coalesced(tensors, devices, buffer_size):
    """Per device, ``tensors`` there (the first device keeps the originals)."""
    for t in tensors:
        _check_npu(t, "broadcast_coalesced")
        if t.device.index != devices[0]:
            raise RuntimeError(f"all tensors must be on devices[0]: {devices[0]}, got one on {t.device}")
    return [list(tensors)] + [[_to(t, d) for t in tensors] for d in devices[1:]]


def _scatter(tensor, devices, chunk_sizes=None, dim=0, streams=None):
    """Chunk ``i`` of ``tensor`` along ``dim`` copied to ``devices[i]`` (on ``streams[i]`` if given)."""
    if chunk_sizes is not None:
        if sum(chunk_sizes) != tensor.size(dim):
            raise RuntimeError(f"given chunk sizes don't sum up to the tensor's size (sum(chunk_sizes) == "
                               f"{sum(chunk_sizes)}, but expected {tensor.size(dim)})")
        chunks = tensor.split(list(chunk_sizes), dim)
    else:
        chunks = tensor.chunk(len(devices), dim)
    out = []
    for i, (d, chunk) in enumerate(zip(devices, chunks)):
        out.append(_to(chunk.contiguous(), d, streams[i] if streams else None))
    return tuple(out)


def _scatter_out(tensor, out, dim=0, streams=None):
    chunks = tensor.split([o.size(dim) for o in out], dim)
    for i, (o, chunk) in enumerate(zip(out, chunks)):
        with _on(streams[i] if streams else None):
            o.copy_(_to(chunk, o.device.index), non_blocking=True)
    return out


def _gather(tensors, dim=0, destination=None):
    """``tensors`` concatenated along ``dim`` on ``destination`` (an NPU index, -1: the CPU)."""
    for t in tensors:
        _check_npu(t, "gather")
    target = tensors[0].device.index if destination is None else destination
    return torch.cat([_to(t, target) for t in tensors], dim)


def _gather_out(tensors, out, dim=0):
    parts = out.split([t.size(dim) for t in tensors], dim)
    for part, t in zip(parts, tensors):
        part.copy_(_to(t, -1 if out.device.type == "cpu" else out.device.index))
    return out


FUNCTIONS = {name: fn for name, fn in globals().items()
             if name in ("_broadcast", "_broadcast_out", "_broadcast_coalesced", "_scatter", "_scatter_out",
                         "_gather", "_gather_out")}


def install() -> None:
    """Add the functions to ``torch._C`` where torch lacks them (a CUDA build keeps its own)."""
    for name, fn in FUNCTIONS.items():
        if not hasattr(torch._C, name):
            setattr(torch._C, name, fn)
