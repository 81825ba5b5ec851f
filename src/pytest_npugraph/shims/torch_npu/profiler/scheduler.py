"""The profiler's step schedule (``torch_npu.profiler.schedule``), with torch_npu's parameter checks."""
import os
import time
from enum import Enum

from pytest_npugraph.runtime.errors import ErrCode, pta_error

__all__ = ["ProfilerAction", "Schedule"]


def _warn(message: str) -> None:
    """torch_npu's ``print_warn_msg``: printed, not a Python warning (a suite run with -W error is unaffected)."""
    stamp = time.strftime("[%Y-%m-%d %H:%M:%S]", time.localtime())
    print(f"{stamp} [WARNING] [{os.getpid()}] profiler.py: {message}", flush=True)


class ProfilerAction(Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class Schedule:
    """Skip ``skip_first`` steps, then cycles of ``wait`` idle, ``warmup`` and ``active`` recorded steps
    (the last one saves), ``repeat`` times (0: until the profiler stops)."""

    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0,
                 skip_first_wait: int = 0) -> None:
        self.wait, self.active, self.warmup = wait, active, warmup
        self.repeat, self.skip_first, self.skip_first_wait = repeat, skip_first, skip_first_wait
        self._check_params()

    def __call__(self, step: int) -> ProfilerAction:
        if step < 0:
            raise ValueError("Invalid parameter step, which must be not less than 0." + pta_error(ErrCode.VALUE))
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait != 0:
            step += self.wait
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step / cycle >= self.repeat:
            return ProfilerAction.NONE
        position = step % cycle
        if position < self.wait:
            return ProfilerAction.NONE
        if position < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if position < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    def _check_params(self):
        for name, minimum, reset in (("wait", 0, 0), ("warmup", 0, 0), ("active", 1, 1), ("repeat", 0, 0),
                                     ("skip_first", 0, 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < minimum:
                _warn(f"Invalid parameter {name}, reset it to {reset}.")
                setattr(self, name, reset)
        if not isinstance(self.skip_first_wait, int):
            _warn("Invalid parameter skip_first_wait, reset it to 0.")
            self.skip_first_wait = 0
        if self.warmup == 0:
            _warn("Profiler won't be using warmup, this can skew profiler results")


def _default_schedule_fn(_: int) -> ProfilerAction:
    return ProfilerAction.RECORD
