"""``torch_npu.save_npugraph_tensor`` / ``print_npugraph_tensor`` (``npu::`` ops, mirrors
``torch_npu/npu/graphs.py``): a tensor saved with ``torch.save`` (printed) when the stream reaches the
op, also inside a captured graph, where it happens at each replay (the real op launches a host
function on a save stream; the emulator computes values in stream order, so it writes at the op).

File names as torch_npu builds them: ``<stem>_device_<i>_<n><suffix>`` (``n`` counts the saves to that
name; ``overwrite=True``: no count), ``tensor_<timestamp>.pt`` without a ``save_path``; a CPU tensor has
no ``_device_<i>``.  The counters are per test (torch_npu's are per process)."""
from __future__ import annotations

import os
from datetime import datetime
import torch
from torch.fx.node import has_side_effect


def _counters() -> dict:
    from pytest_npugraph.runtime.runtime import current

    return current().extensions.setdefault("torch_npu.save_npugraph_tensor", {})


def _path(save_path=None, device_index=None, overwrite=False) -> str:
    if save_path is None:
        save_path = f"tensor_{datetime.now().strftime('%Y%m%d_%H%M%S_%f')}.pt"
    if not isinstance(save_path, str):
        raise TypeError(f"save_path must be str or None, but got {type(save_path).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be bool, but got {type(overwrite).__name__}")
    directory, filename = os.path.split(save_path)
    stem, suffix = os.path.splitext(filename)
    if not stem:
        raise ValueError("save_path must include a file name")
    suffix = suffix or ".pt"
    if device_index is not None:
        stem = f"{stem}_device_{device_index}"
    if not overwrite:
        counters = _counters()
        key = os.path.join(directory, f"{stem}{suffix}")
        index = counters.get(key, 0)
        counters[key] = index + 1
        stem = f"{stem}_{index}"
    return os.path.join(directory, f"{stem}{suffix}") if directory else f"{stem}{suffix}"


def _device_and_values(t: torch.Tensor):
    """(device index or None for a host tensor, the values as a CPU tensor).  The kernel runs on the
    CPU payloads of NPU tensors (eagerly and when a graph replays): their blocks name the device."""
    from pytest_npugraph.runtime import tensor as npu_tensor
    from pytest_npugraph.runtime.graphs import replaying_device

    payload = getattr(t, "_payload", t)
    if isinstance(t, npu_tensor.NpuTensor):
        return t.device.index, payload.detach().clone()
    replaying = replaying_device.get()
    if replaying is not None:          # a replay recomputes the graph's ops on its tensors' payloads
        return replaying, payload.detach().clone()
    block = npu_tensor.block_of_storage(payload.untyped_storage().data_ptr()) if payload.numel() else None
    return (None if block is None else block.device), payload.detach().clone()


def _capturing() -> bool:
    """A capture records the op, it does not run it (the replays do)."""
    from pytest_npugraph.runtime.runtime import current

    return current().current_stream().capture is not None


def _save(input, save_path=None, overwrite=False):
    if not isinstance(input, torch.Tensor) or _capturing():
        return
    device, values = _device_and_values(input)
    torch.save(values, _path(save_path, device, overwrite))


def _save_list(input, save_path=None, overwrite=False):
    if not isinstance(input, (list, tuple)):
        raise TypeError(f"input must be Tensor or TensorList, but got {type(input).__name__}")
    if len(input) == 0:
        raise ValueError("input tensor list must not be empty")
    if not all(isinstance(t, torch.Tensor) for t in input):
        raise TypeError("all elements in input tensor list must be Tensor")
    if _capturing():
        return
    pairs = [_device_and_values(t) for t in input]
    if len({d for d, _ in pairs}) > 1:
        raise ValueError("all tensors in input tensor list must be on the same device")
    torch.save([v for _, v in pairs], _path(save_path, pairs[0][0], overwrite))


def _print(input, tensor_name=None):
    if not isinstance(input, torch.Tensor) or _capturing():
        return
    _, values = _device_and_values(input)
    text = str(values) if tensor_name is None else f"{tensor_name}={values}"
    print(f"{text}, shape={tuple(values.shape)}, dtype={values.dtype}", flush=True)


_lib = torch.library.Library("npu", "FRAGMENT")
if not hasattr(torch.ops.npu, "save_npugraph_tensor"):
    _lib.define("save_npugraph_tensor(Tensor input, *, str? save_path=None, bool overwrite=False) -> ()")
    _lib.define("save_npugraph_tensor.tensor_list(Tensor[] input, *, str? save_path=None, bool overwrite=False) -> ()")
    for _key in ("PrivateUse1", "CPU"):
        _lib.impl("save_npugraph_tensor", _save, _key)
        _lib.impl("save_npugraph_tensor.tensor_list", _save_list, _key)
    _lib.impl("save_npugraph_tensor", lambda input, *, save_path=None, overwrite=False: None, "Meta")
    _lib.impl("save_npugraph_tensor.tensor_list", lambda input, *, save_path=None, overwrite=False: None, "Meta")
    has_side_effect(torch.ops.npu.save_npugraph_tensor.default)
    has_side_effect(torch.ops.npu.save_npugraph_tensor.tensor_list)

if not hasattr(torch.ops.npu, "print_npugraph_tensor"):
    _lib.define("print_npugraph_tensor(Tensor input, *, str? tensor_name=None) -> ()")
    for _key in ("PrivateUse1", "CPU"):
        _lib.impl("print_npugraph_tensor", _print, _key)
    _lib.impl("print_npugraph_tensor", lambda input, *, tensor_name=None: None, "Meta")
    has_side_effect(torch.ops.npu.print_npugraph_tensor.default)

