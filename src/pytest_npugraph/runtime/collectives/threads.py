"""``npugraph.run_ranks``: the rank function in one thread per emulated device, with a watch on
ranks whose host is stuck outside the device (the transport of a ``Job`` inside one process)."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from .. import rank_rng
from ..executor import DeviceHang
from .errors import CollectiveAborted
from .ranks import _POLL, Job, binding, claim_world

_GRACE = 2.0          # seconds run_ranks gives the other ranks once the job has failed


# ------------------------------------------------------------------------- run_ranks
@dataclass
class _Outcome:
    result: object = None
    error: Optional[BaseException] = None
    when: float = 0.0


def run_ranks(runtime, fn: Callable, args: tuple, context=None) -> list:
    """Run ``fn(rank, *args)`` once per device of ``runtime``, each in its own thread with its
    own current device; returns the results in rank order or raises the first failure.

    ``context(job)`` (optional) is a context manager entered around the threads (the
    torch.distributed per-thread world, see shims/torch_npu/distributed) and
    ``context.rank(job, rank)`` one entered inside each rank thread around ``fn``.
    """
    if binding() is not None:
        raise RuntimeError("npugraph.run_ranks cannot be nested: it is already running ranks in this thread")
    jobs = claim_world(runtime)
    size = len(runtime.devices)
    job = Job(runtime, size, "" if jobs == 1 else f"@{jobs}")
    outcomes = [_Outcome() for _ in range(size)]

    def main(rank: int) -> None:
        runtime.thread().rank = (job, rank)
        runtime.set_current_device(rank)
        rank_rng.enter_rank()           # its own CPU generator, as a rank process has
        failed = False
        try:
            if context is None:
                outcomes[rank].result = fn(rank, *args)
            else:
                with context.rank(job, rank):
                    outcomes[rank].result = fn(rank, *args)
        except BaseException as exc:  # noqa: BLE001 (handed to the calling thread)
            failed = True
            outcomes[rank].error, outcomes[rank].when = exc, time.monotonic()
        finally:
            job.finish(rank, failed)
            runtime.thread().rank = None
            rank_rng.leave_rank()

    threads = [threading.Thread(target=main, args=(rank,), name=f"npugraph-rank-{rank}", daemon=True)
               for rank in range(size)]
    guard = context(job) if context is not None else contextlib.nullcontext()
    # NPU tensors die where their last reference goes: the cyclic collector would run their
    # frees in whichever rank thread it interrupts, racing that device's own thread
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with guard:
            for t in threads:
                t.start()
            _join(job, threads)
        if job.failure is None and not any(o.error for o in outcomes):
            job.leftover()
    finally:
        if collecting:
            gc.enable()
        if isinstance(job.failure, DeviceHang):
            runtime.executor.abandon()     # the hung work is reported; the test goes on without it
    return _results(job, outcomes)


def _join(job: Job, threads: list) -> None:
    """Wait for every rank; once the job failed, give the stragglers a short grace only.  Ranks
    whose host sits on one Python line (a lock, an ``Event.wait``, a queue nobody fills) while
    the job records no activity for the stall timeout end the job, as a blocked rank's own clock
    does (``Job.host_wait``): the test fails with the lines instead of hanging."""
    deadline = None
    still = _Stillness(threads, job)
    for t in threads:
        while t.is_alive():
            t.join(_POLL)
            if job.failure is None and still.stalled():
                with job.cond:
                    job._fail(job._stalled(job._timeout(), still.where()))
            if job.failure is not None and deadline is None:
                deadline = time.monotonic() + _GRACE
            if deadline is not None and time.monotonic() > deadline:
                return


class _Stillness:
    """Whether the job recorded no activity for the stall timeout while every live rank's host stood
    on one Python line (a computing rank moves between lines or records work).  The rank threads'
    frames are looked at only after half the timeout without activity: holding a rank's frame,
    even for a moment, can make its NPU tensors die in this thread."""

    def __init__(self, threads: list, job: Job):
        self.threads, self.job = threads, job
        self.activity, self.quiet_since = None, time.monotonic()
        self.lines, self.still_since = None, None

    def stalled(self) -> bool:
        now, activity, timeout = time.monotonic(), self.job._activity(), self.job._timeout()
        if activity != self.activity:
            self.activity, self.quiet_since, self.lines = activity, now, None
            return False
        if now - self.quiet_since < timeout / 2:
            return False
        lines = self._lines()
        if lines != self.lines or lines is None:
            self.lines, self.still_since = lines, now
            return False
        return now - self.still_since >= timeout / 2

    def _lines(self) -> tuple:
        """Each live rank's line; None while a rank imports a module (progress, however long a loaded
        machine takes: the other ranks wait for the import lock on their own line meanwhile)."""
        frames = sys._current_frames()
        try:
            if any(_importing(frames.get(t.ident)) for t in self.threads if t.is_alive()):
                return None
            return tuple((t.ident, _line(frames.get(t.ident))) for t in self.threads if t.is_alive())
        finally:
            del frames

    def where(self) -> str:
        frames = sys._current_frames()
        where = "; ".join(f"{t.name} at {_user_line(frames.get(t.ident))}" for t in self.threads if t.is_alive())
        del frames
        return where


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _line(frame) -> tuple:
    return (frame.f_code, frame.f_lineno) if frame is not None else ()


def _user_line(frame) -> str:
    """The innermost frame outside Python's threading/queue modules (where the user's code waits)."""
    first = frame
    while frame is not None and os.path.basename(frame.f_code.co_filename) in ("threading.py", "queue.py"):
        frame = frame.f_back
    frame = frame or first
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _results(job: Job, outcomes: list) -> list:
    errors = sorted((o.when, rank, o.error) for rank, o in enumerate(outcomes)
                    if o.error is not None and not isinstance(o.error, CollectiveAborted)
                    and o.error is not job.failure)
    if errors:
        _, rank, error = errors[0]
        note = f"(raised in rank {rank} (npu:{rank}) of npugraph.run_ranks)"
        if hasattr(error, "add_note"):
            error.add_note(note)
            raise error
        raise RuntimeError(f"{note[1:-1]}: {error!r}") from error
    if job.failure is not None:
        raise job.failure
    return [o.result for o in outcomes]
