"""One default random generator per emulated device, apart from the CPU's.

Why: on hardware each NPU has its own generator (``torch.npu.default_generators[i]``, seeded with
c10's ``default_rng_seed_val`` at start), so seeding or drawing on one device leaves the CPU's
generator and the other devices' alone (``torch.npu.manual_seed`` does not change ``torch.randn``
on the CPU).  NPU ops compute on the CPU here, and the CPU kernels of random ops draw from torch's
CPU default generator (``native_dropout`` and friends take no generator argument), so a random op
on npu:N runs with the CPU default generator holding npu:N's state for the duration (``drawing``),
which then goes back to the device's generator: the CPU's own state is untouched.

Which ops draw: those tagged ``nondeterministic_seeded`` (every aten op with a ``generator``
argument, dropout, ...).  An op given its own generator (``torch.Generator(device="npu:1")``, a CPU
generator reporting npu:1) draws from that one; swapping the default around it changes nothing.

Graph capture (graphs.py): a capture draws nothing (the capture device's state is restored at its
end) and each replay draws from the device's state at replay time.  ``get_rng_state`` /
``set_rng_state`` inside a capture are graph nodes, as torch_npu's graph-safe generator state makes
them: a state read in the capture is re-read at that point of every replay, and setting it back
(activation checkpointing's ``preserve_rng_state``) makes the replay draw the same numbers again.
"""
from __future__ import annotations

import contextlib
import threading

import torch

DEFAULT_SEED = 67280421310721     # c10::detail::default_rng_seed_val, every device generator's first seed
_lock = threading.RLock()         # one swap of the CPU default generator at a time (rank threads)
_seeded: dict = {}                # OpOverload -> whether it draws random numbers
_rank = threading.local()         # .npu: a run_ranks rank thread's own device generators (rank_rng.py)
_swaps = threading.local()        # .open: how many swaps this thread has open (drawing, drawing_from_state)


class NpuGenerator(torch._C.Generator):
    """A generator of the emulated NPU ``npu:N``: a CPU generator (the kernels are CPU kernels) that
    reports its NPU device."""

    def __new__(cls, index: int):
        g = super().__new__(cls, "cpu")
        g._npu_index = index
        return g

    def __init__(self, *args, **kwargs):
        pass

    @property
    def device(self):
        return torch.device("npu", self._npu_index)

    def __reduce__(self):
        return type(self), (self._npu_index,), self.get_state()

    def __setstate__(self, state):
        self.set_state(state)

    def __repr__(self):
        return f"<torch._C.Generator object at {id(self):#x} device={self.device}>"


def default_generator(rt, index: int) -> NpuGenerator:
    """npu:``index``'s default generator in the running test (made, seeded, on first use); in a
    ``run_ranks`` rank thread, the rank's own (a rank process has a generator per device)."""
    gens = getattr(_rank, "npu", None)
    if gens is None:
        gens = rt.generators
    g = gens.get(index)
    if g is None:
        rt.device(index)                 # a device this machine has (the error names the marker)
        g = gens[index] = NpuGenerator(index)
        g.manual_seed(DEFAULT_SEED)
    return g


def seeded(func) -> bool:
    """Whether the op draws random numbers (``nondeterministic_seeded``)."""
    found = _seeded.get(func)
    if found is None:
        found = _seeded[func] = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
    return found


@contextlib.contextmanager
def drawing(generator):
    """The CPU default generator holds ``generator``'s state for the block, which then goes back to
    ``generator`` (advanced by what the block drew); the CPU's own state is restored."""
    cpu = torch.default_generator
    with _lock, _open():
        saved = cpu.get_state()
        cpu.set_state(generator.get_state())
        try:
            yield
        finally:
            generator.set_state(cpu.get_state())
            cpu.set_state(saved)


def swapped() -> bool:
    """Whether this thread has a swap open: the CPU default generator holds the state the block's
    draws must come from (a rank's, a device's), which a second swap must not replace."""
    return getattr(_swaps, "open", 0) > 0


@contextlib.contextmanager
def _open():
    _swaps.open = getattr(_swaps, "open", 0) + 1
    try:
        yield
    finally:
        _swaps.open -= 1


def drawing_on(rt, index: int):
    """``drawing`` from npu:``index``'s default generator."""
    return drawing(default_generator(rt, index))


@contextlib.contextmanager
def drawing_from_state(state: torch.Tensor):
    """The CPU default generator holds ``state`` for the block (a deferred op's values drawn from
    the state its issue saw; nothing is advanced)."""
    cpu = torch.default_generator
    with _lock, _open():
        saved = cpu.get_state()
        cpu.set_state(state)
        try:
            yield
        finally:
            cpu.set_state(saved)
