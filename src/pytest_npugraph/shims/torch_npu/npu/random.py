"""Random number generators of the NPUs (mirrors ``torch_npu/npu/random.py``): one default generator
per device (``runtime.generators``), never the CPU's, so seeding the NPU leaves ``torch.randn`` on the
CPU as it was.  Inside a graph capture, the capture device's ``get_rng_state``/``set_rng_state`` are
part of the graph (replayed, as torch_npu's graph-safe generator state)."""
from __future__ import annotations

from typing import Union

import torch

import torch_npu
from pytest_npugraph.runtime import generators as _generators
from pytest_npugraph.runtime.backend import device_index as _device_index
from pytest_npugraph.runtime.runtime import current as _rt

__all__ = ["get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "manual_seed",
           "manual_seed_all", "seed", "seed_all", "initial_seed"]


def _index(device) -> int:
    """torch.accelerator's ``_get_device_index(device, optional=True)``: "npu", None -> current device."""
    return _device_index(device)


def _generator(index: int):
    return _generators.default_generator(_rt(), index)


def _capture_on(index: int):
    """The capture underway on npu:``index``'s current stream of this thread, if any."""
    return _rt().current_stream(index).capture


def _check_seed_during_capture(index: int, seed: int) -> None:
    """A generator of a device in stream capture keeps its seed (NPUGeneratorImpl::set_current_seed)."""
    if _capture_on(index) is not None and seed != _generator(index).initial_seed():
        raise RuntimeError("NPUGeneratorImpl::set_current_seed can be called during stream capture only if new seed "
                           "is the same as the original seed.")


def get_rng_state(device: Union[int, str, torch.device] = "npu") -> torch.Tensor:
    """The generator state of the NPU ``device`` (the current one by default) as a ByteTensor."""
    torch_npu.npu._lazy_init()
    index = _index(device)
    capture = _capture_on(index)
    if capture is not None:
        return capture.rng_get()
    return _generator(index).get_state()


def get_rng_state_all():
    return [get_rng_state(i) for i in range(torch_npu.npu.device_count())]


def set_rng_state(new_state: torch.Tensor, device: Union[int, str, torch.device] = "npu") -> None:
    """Set the generator state of the NPU ``device`` (the current one by default)."""
    index = _index(device)
    capture = _capture_on(index)
    if capture is not None:
        probe = torch.Generator()
        probe.set_state(new_state)
        _check_seed_during_capture(index, probe.initial_seed())
        capture.rng_set(new_state)
        return
    _generator(index).set_state(new_state)


def set_rng_state_all(new_states) -> None:
    if not isinstance(new_states, (list, tuple)):
        raise TypeError(f"set_rng_state_all(): new_states must be a list of ByteTensors (one per device), "
                        f"got {type(new_states).__name__}")
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed) -> None:
    """Seed the current NPU's generator (not the CPU's, not the other NPUs')."""
    seed = int(seed)
    index = _index(None)
    _check_seed_during_capture(index, seed)
    _generator(index).manual_seed(seed)


def manual_seed_all(seed) -> None:
    """Seed every NPU's generator (``torch.manual_seed`` calls this for the npu device too)."""
    seed = int(seed)
    for i in range(torch_npu.npu.device_count()):
        _check_seed_during_capture(i, seed)
        _generator(i).manual_seed(seed)


def seed() -> None:
    """Seed the current NPU's generator with a non-deterministic random number."""
    _generator(_index(None)).seed()


def seed_all() -> None:
    """One non-deterministic seed for every NPU's generator."""
    first = None
    for i in range(torch_npu.npu.device_count()):
        if first is None:
            _generator(i).seed()
            first = _generator(i).initial_seed()
        else:
            _generator(i).manual_seed(first)


def initial_seed() -> int:
    """The current NPU generator's initial seed."""
    torch_npu.npu._lazy_init()
    return _generator(_index(None)).initial_seed()


def default_generators() -> tuple:
    """``torch.npu.default_generators``: the running test's generator of each device."""
    return tuple(_generator(i) for i in range(torch_npu.npu.device_count()))
