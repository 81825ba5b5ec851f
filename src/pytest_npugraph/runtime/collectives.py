"""Collectives between the emulated devices of one test: rank threads, rendezvous, matching, and the
c10d collectives' math (an MC2 op's math lives with its spec, ``OpSpec.mc2_math`` in ops/mc2.py).

``npugraph.run_ranks(fn, *args)`` runs ``fn(rank, *args)`` in one thread per emulated device
(rank r drives ``npu:r``), as ``torchrun`` runs one process per card.  The emulated
``ProcessGroupHCCL`` (``shims/torch_npu/distributed``) and the MC2 ops hand every collective
call to a ``Job`` (one per ``run_ranks`` call), which:

1. records it: a ``Kernel`` on the calling rank's current stream, in the rank's program order,
   named ``hccl::<collective>`` (``hccl::all_reduce``, ``hccl::reduce_scatter``, ...) or after
   the MC2 op (``npu::npu_moe_distribute_dispatch``), with the bytes it reads and writes, its
   ``OpCores`` and ``collective=(communicator, seq)``: ``seq`` numbers the communicator's
   collectives on each rank, so the analyses pair the members of one collective across
   devices.  Cores come from the ``pytest_npugraph_op_profile`` hook (asked with the short
   name, e.g. ``"reduce_scatter"`` or ``"npu_moe_distribute_dispatch"``, on every call, so a
   per-test answer is honoured), else the op specs (MC2 ops: vector cores), else its
   communicator's HCCL expansion mode (``hccl_modes.py``): only an AIV-mode collective takes
   vector cores (every one, held while it waits for its peers).
2. asynchrony: as HCCL's launch, issuing returns at once; the collective is a task queued on
   the rank's stream (executor.py) that completes when every member issued the same op as
   that ``(communicator, seq)`` and each member's task heads its stream: then its math runs
   on the CPU payloads of every member (arguments that disagree raise ``CollectiveError``).
   Issue order across communicators and streams is free.
3. never waits on a hang: a host waits only in synchronize, host reads and blocking copies.
   When every rank is blocked there or has returned and nothing can run (a member that never
   issues a collective, one communicator's collectives in different orders on two ranks, a
   rank that raised), the ranks end with ``DeviceHang`` (on hardware: a hang until the HCCL
   timeout), which ``npugraph.expect("deadlock")`` absorbs with the ``deadlock`` hazard the
   trace shows; so does work still queued when every rank returned.  Only a rank stuck
   outside the device (in user code) is left to a timeout (``NPUGRAPH_COLLECTIVE_TIMEOUT``,
   default 30 s without any recorded activity).

Trace conventions (read by analysis/taskgraph.py, cores.py, deadlock.py): the runtime's
``DeviceCores`` per device; one
``GroupCreated`` when a communicator is created; each
rank's kernels in its program order on their streams; collectives keyed as above.  The
communicator name is also what ``get_hccl_comm_name`` returns, hence the MC2 ``group_ep``.
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..errors import NotEmulated
from .. import trace as T
from .._context import CONTEXT
from . import hccl_modes, profiles
from .callsite import user_site
from .executor import DeviceHang, Item
from .tensor import NpuTensor, span, wrap

DEFAULT_TIMEOUT = float(os.environ.get("NPUGRAPH_COLLECTIVE_TIMEOUT", "30"))
_POLL = 0.25          # seconds between a waiting rank's looks at the clock (the last resort)
_GRACE = 2.0          # seconds run_ranks gives the other ranks once the job has failed


class CollectiveError(RuntimeError):
    """Collectives that cannot complete (mismatched, abandoned, circular, timed out) or whose
    arguments do not agree across ranks; the message names ranks, ops and user lines."""


class CollectiveAborted(CollectiveError):
    """Raised in the ranks that were waiting when another rank's failure ended the job."""


# ----------------------------------------------------------------------------- records
@dataclass(eq=False)
class Communicator:
    """An HCCL communicator: one ``torch.distributed`` group of one job."""

    name: str             # the trace group and the HCCL comm name ("hccl/0", "hccl/1@2", ...)
    torch_name: str       # torch.distributed's group name ("0", "1", ...)
    members: tuple        # the rank (thread / device) of each group rank
    timeout: float
    mode: str = "HOST"    # HCCL op expansion mode of its collectives (hccl_modes.py)


@dataclass(eq=False)
class Call:
    """One rank's side of a collective: what it reads, writes and passes."""

    op: str                        # "all_reduce", "npu_moe_distribute_dispatch", ...
    kernel: str                    # the trace op name
    inputs: tuple = ()             # NPU tensors read
    outputs: tuple = ()            # NPU tensors written (their payloads receive the results)
    params: dict = field(default_factory=dict)
    rank: int = -1                 # group rank, filled in by Job.issue
    thread: int = -1
    site: T.Site = T.UNKNOWN_SITE

    def where(self) -> str:
        return f"rank {self.thread} issued {self.op} at {self.site}"


@dataclass(eq=False)
class Pending:
    comm: Communicator
    seq: int
    op: str
    calls: dict = field(default_factory=dict)   # group rank -> Call
    items: dict = field(default_factory=dict)   # group rank -> its executor.Item (queued on its stream)
    streams: dict = field(default_factory=dict)  # group rank -> sid
    mismatched: list = field(default_factory=list)  # calls of another op under the same (comm, seq)
    done: bool = False

    def describe(self) -> str:
        return f"{self.op} #{self.seq} of communicator {self.comm.name!r}"

    def missing(self) -> list:
        return [t for r, t in enumerate(self.comm.members) if r not in self.calls]


def binding():
    """``(job, rank)`` of the calling thread: its run_ranks rank, or None outside run_ranks."""
    from .runtime import peek

    rt = peek()
    return None if rt is None else rt.thread().rank


# ---------------------------------------------------------------------------------- job
class Job:
    """The ranks of one ``run_ranks`` call and the collectives between them."""

    def __init__(self, runtime, size: int, label: str = "", bound_devices: bool = True):
        self.runtime = runtime
        self.size = size
        self.label = label                  # "" for the first job of a test, "@2", ...
        self.bound_devices = bound_devices  # rank r's collectives take tensors on npu:r
        self.cond = runtime.executor.cond   # one lock for device work and the ranks' host waits
        self.status = ["running"] * size    # running | blocked | done | failed
        self.blocked_at: dict = {}          # rank -> what its host waits in
        self.blocked_until: dict = {}       # rank -> the condition that ends its wait
        self.pending: dict = {}             # (comm name, seq) -> Pending
        self.comms: dict = {}               # comm name -> Communicator
        self.incarnations: dict = {}        # (rank, torch group name) -> times created
        self.seqs: dict = {}                # (comm name, rank) -> next seq
        self.failure: Optional[CollectiveError] = None
        self.events = 0                     # rendezvous activity, for the stall clock

    # -- communicators
    def communicator(self, rank: int, torch_name: str, members: tuple, timeout: float,
                     mode: str = "HOST") -> Communicator:
        """The communicator of group ``torch_name`` as rank ``rank`` creates it (collectively:
        every member creates its groups in the same order, so the n-th creation matches)."""
        with self.cond:
            key = (rank, torch_name)
            n = self.incarnations.get(key, 0)
            self.incarnations[key] = n + 1
            name = f"hccl/{torch_name}" + (f".{n}" if n else "") + self.label
            comm = self.comms.get(name)
            if comm is None:
                comm = self.comms[name] = Communicator(name, torch_name, tuple(members), timeout, mode)
                devices = tuple(sorted(set(comm.members)))
                self.runtime.marker(T.GroupCreated, group=name, devices=devices, site=user_site(4))
            elif comm.members != tuple(members):
                raise self._fail(CollectiveError(
                    f"rank {rank} created process group {torch_name!r} with ranks {list(members)}, but "
                    f"another rank created it with ranks {list(comm.members)}: every rank must call "
                    f"new_group with the same ranks, in the same order"))
            return comm

    def by_name(self, name: str) -> Optional[Communicator]:
        return self.comms.get(name)

    # -- collectives
    def issue(self, comm: Communicator, rank: int, call: Call) -> None:
        """Record ``call`` on the rank's current stream and queue it there: it completes (its
        outputs then hold the results) once every member issued it and stands at the head of its
        stream (executor.py); the host goes on at once, as HCCL's launch returns."""
        rt = self.runtime
        device = _device_of(call, rank if self.bound_devices else rt.current_device())
        if self.bound_devices and device != rank:
            raise ValueError(f"{call.op} on rank {rank}: tensors on npu:{device}, but rank {rank}'s process groups "
                             f"use npu:{rank} (rank r of npugraph.run_ranks drives npu:r)")
        stream = rt.current_stream(device)
        if stream.capture is not None:
            raise NotEmulated(
                f"{call.op}: collectives inside NPU graph capture are not emulated by pytest-npugraph")
        cores = op_cores(call.kernel, rt.devices[device], comm.mode)
        if call.kernel.startswith("hccl::"):
            hccl_modes.launch(self, comm, call.kernel[6:], stream)    # HCCL's launch checks (AIV mode)
        call.thread = rank
        call.rank = comm.members.index(rank)
        call.site = user_site(3)
        with self.cond:
            self._check_failed()     # a rank the job gave up on issues nothing more
            seq = self.seqs.get((comm.name, rank), 0)
            self.seqs[(comm.name, rank)] = seq + 1
        reads = [s for s in map(span, call.inputs) if s is not None]
        writes = [s for s in map(span, call.outputs) if s is not None]
        kseq = rt.kernel(stream, call.kernel, reads, writes, cores=cores, site=call.site,
                         collective=(comm.name, seq))
        with self.cond:
            self._check_failed()
            key = (comm.name, seq)
            p = self.pending.get(key)
            if p is None:
                p = self.pending[key] = Pending(comm, seq, call.op)
            if p.op != call.op:
                p.mismatched.append(call)   # the device hangs (deadlock analysis: collective_mismatch)
            else:
                p.calls.setdefault(call.rank, call)
            p.streams[call.rank] = stream.sid
            self.events += 1
            item = Item(kseq, lambda: self._complete(p), lambda: self._ready(p),
                        f"{p.describe()} issued by rank {rank} at {call.site}")
            p.items.setdefault(call.rank, item)
            rt.executor.enqueue(stream.sid, item)

    def _ready(self, p: Pending) -> bool:
        """Every member issued the same op and its item heads its stream's queue."""
        if p.done or p.mismatched or len(p.items) < len(p.comm.members):
            return False
        ex = self.runtime.executor
        return all(ex.head(p.streams[r]) is item for r, item in p.items.items())

    def _complete(self, p: Pending) -> None:
        calls = [p.calls[r] for r in range(len(p.comm.members))]
        self.pending.pop((p.comm.name, p.seq), None)
        p.done = True
        try:
            MATH[p.op](calls)
        except CollectiveError as exc:
            raise self._fail(CollectiveError(f"{p.describe()}: {exc}\n  " +
                                             "\n  ".join(c.where() for c in calls))) from None
        ex = self.runtime.executor
        for r, sid in p.streams.items():      # every member leaves its queue once the results are written
            item = p.items.get(r)
            if item is not None:
                ex.pop_head(sid, item)
        p.calls = {}    # each rank's tensors die in its own thread (the allocator is per device)
        self.cond.notify_all()

    # -- host waits inside the ranks
    def host_wait(self, rank: int, until, what: str) -> None:
        """Rank ``rank``'s host blocks until ``until()``; other ranks may release it.  When every
        rank is blocked or finished and nothing can run, the device hangs: ``DeviceHang``."""
        ex = self.runtime.executor
        clock = [self._activity(), time.monotonic()]

        def blocked():
            self._check_failed()
            self.status[rank] = "blocked"
            self.blocked_at[rank] = what
            self.blocked_until[rank] = until
            if all(s != "running" for s in self.status) and not any(u() for u in self.blocked_until.values()):
                raise self._fail(self._hang())   # (a blocked rank whose wait is over has not woken yet)
            now, activity = time.monotonic(), self._activity()
            if activity != clock[0]:
                clock[0], clock[1] = activity, now
            elif now - clock[1] > self._timeout():
                raise self._fail(self._stalled(self._timeout()))
        try:
            ex.wait(until, blocked, what)
        finally:
            with self.cond:
                if self.status[rank] == "blocked":
                    self.status[rank] = "running"
                self.blocked_at.pop(rank, None)
                self.blocked_until.pop(rank, None)

    def _timeout(self) -> float:
        """Seconds without progress before a blocked rank gives up: the shortest process group
        timeout, at most ``NPUGRAPH_COLLECTIVE_TIMEOUT``."""
        return min([DEFAULT_TIMEOUT] + [c.timeout for c in self.comms.values()])

    def _activity(self) -> tuple:
        return (self.events, len(self.runtime.trace), self.runtime.executor.progress)

    # -- ranks
    def finish(self, rank: int, failed: bool) -> None:
        with self.cond:
            self.status[rank] = "failed" if failed else "done"
            self.events += 1
            self.cond.notify_all()

    def leftover(self) -> Optional["DeviceHang"]:
        """After every rank returned: device work that can never run (a hang on hardware)."""
        ex = self.runtime.executor
        with self.cond:
            ex.drain()
            if self.failure is None and ex.pending():
                return self._fail(self._hang(finished=True))
        return None

    # -- failure detection
    def _check_failed(self) -> None:
        if self.failure is not None:
            raise CollectiveAborted(f"aborted: another rank ended the job: {self.failure}")

    def _fail(self, error: Exception) -> Exception:
        if self.failure is None:
            self.failure = error
        self.cond.notify_all()
        return error

    # -- messages
    def _stuck(self) -> list:
        """One line per collective that cannot complete: who issued it, who did not, and what else
        was issued under its (communicator, seq)."""
        lines = []
        for p in sorted(self.pending.values(), key=lambda p: (p.comm.name, p.seq)):
            if p.mismatched:
                issued = "; ".join(c.where() for c in sorted(list(p.calls.values()) + p.mismatched,
                                                             key=lambda c: c.thread))
                lines.append(f"collective #{p.seq} of communicator {p.comm.name!r} is not the same op on every "
                             f"rank: {issued}")
                continue
            issued = ", ".join(f"rank {c.thread} at {c.site}" for c in p.calls.values())
            line = f"{p.describe()}: issued by {issued}"
            missing = [t for r, t in enumerate(p.comm.members) if r not in p.calls]
            if missing:
                line += "; never issued by " + ", ".join(f"rank {t} ({self.status[t]})" for t in missing)
            lines.append(line)
        return lines

    def _hang(self, finished: bool = False) -> DeviceHang:
        waits = "; ".join(f"rank {r} {what}" for r, what in sorted(self.blocked_at.items()))
        stuck = self._stuck() or [self.runtime.executor.describe_stuck()]
        when = ("every rank returned with device work that can never run" if finished else
                f"every rank is blocked or finished ({waits})")
        return DeviceHang(
            f"device hang: {when}. Stuck: " + " | ".join(stuck) + ". On hardware the ranks would wait until "
            f"the HCCL timeout: a communicator pairs its collectives by issue order, so every member must issue "
            f"each of them, in the same order (the deadlock report names the lines).")

    def _stalled(self, timeout: float, where: str = "") -> CollectiveError:
        waits = "; ".join(f"rank {r} {what}" for r, what in sorted(self.blocked_at.items()))
        running = ", ".join(f"rank {r}" for r, s in enumerate(self.status) if s == "running")
        where = f" ({where})" if where else ""
        return CollectiveError(
            f"no progress for {timeout:g} s: {waits + '; ' if waits else ''}{running} running but issuing nothing "
            f"(blocked outside torch.distributed?){where}. Set NPUGRAPH_COLLECTIVE_TIMEOUT to wait longer.")


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
    jobs = runtime.extensions.get("collectives.jobs", 0) + 1
    runtime.extensions["collectives.jobs"] = jobs
    size = len(runtime.devices)
    job = Job(runtime, size, "" if jobs == 1 else f"@{jobs}")
    outcomes = [_Outcome() for _ in range(size)]

    def main(rank: int) -> None:
        runtime.thread().rank = (job, rank)
        runtime.set_current_device(rank)
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
        if lines != self.lines:
            self.lines, self.still_since = lines, now
            return False
        return now - self.still_since >= timeout / 2

    def _lines(self) -> tuple:
        frames = sys._current_frames()
        lines = tuple((t.ident, _line(frames.get(t.ident))) for t in self.threads if t.is_alive())
        del frames
        return lines

    def where(self) -> str:
        frames = sys._current_frames()
        where = "; ".join(f"{t.name} at {_user_line(frames.get(t.ident))}" for t in self.threads if t.is_alive())
        del frames
        return where


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


# ----------------------------------------------------------------------------- profile
def op_cores(op: str, device, mode: Optional[str] = None) -> T.OpCores:
    """Cores of collective ``op`` ("hccl::all_reduce"): the users' hook (asked on every call),
    else the op's spec (MC2 ops: every vector core), else what its communicator's HCCL
    expansion ``mode`` takes (hccl_modes.py; None: the chip's default mode)."""
    name = op.split("::")[-1]
    spec = CONTEXT.op_profile(name)
    if spec is None:
        from .ops import library

        spec = library.cores_of(name)
    if spec is None:
        chip = device.profile.name
        spec = hccl_modes.profile(name, mode or hccl_modes.default_mode(chip), chip)
    return profiles.to_cores(spec, device)


# -------------------------------------------------------------------------------- math
def _p(t: torch.Tensor) -> torch.Tensor:
    return t._payload


def _agree(calls, what: str, value: Callable) -> None:
    """Raise unless ``value(call)`` is the same on every rank."""
    values = [value(c) for c in calls]
    if any(v != values[0] for v in values[1:]):
        shown = ", ".join(f"rank {c.thread}: {v}" for c, v in zip(calls, values))
        raise CollectiveError(f"the ranks pass different {what} ({shown})")


def _meta(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), str(t.dtype).replace("torch.", ""))


_LOW = (torch.float16, torch.bfloat16)


def _reduce(tensors: list, op: str) -> torch.Tensor:
    dtype = tensors[0].dtype
    stacked = torch.stack([t.to(torch.float32) if dtype in _LOW else t for t in tensors])
    floating = dtype.is_floating_point or dtype.is_complex
    if op == "sum":
        out = stacked.sum(0, dtype=dtype if not floating else None)
    elif op == "avg":
        if not floating:
            raise CollectiveError(f"ReduceOp.AVG is not supported for {dtype}")
        out = stacked.mean(0)
    elif op == "product":
        out = stacked.prod(0, dtype=dtype if not floating else None)
    elif op == "min":
        out = stacked.amin(0)
    elif op == "max":
        out = stacked.amax(0)
    elif op in ("band", "bor", "bxor"):
        if floating:
            raise CollectiveError(f"ReduceOp.{op.upper()} is not supported for {dtype}")
        combine = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        out = stacked[0]
        for t in stacked[1:]:
            out = combine(out, t)
    else:
        raise CollectiveError(f"ReduceOp {op} is not supported by the emulated HCCL")
    return out.to(dtype)


def _all_reduce(calls):
    _agree(calls, "reduce ops", lambda c: c.params["reduce"])
    _agree(calls, "tensors", lambda c: [_meta(t) for t in c.outputs])
    for i in range(len(calls[0].outputs)):
        result = _reduce([_p(c.outputs[i]) for c in calls], calls[0].params["reduce"])
        for c in calls:
            _p(c.outputs[i]).copy_(result)


def _reduce_to_root(calls):
    _agree(calls, "reduce ops and roots", lambda c: (c.params["reduce"], c.params["root"]))
    _agree(calls, "tensors", lambda c: [_meta(t) for t in c.outputs])
    root = calls[calls[0].params["root"]]
    for i, out in enumerate(root.outputs):
        _p(out).copy_(_reduce([_p(c.outputs[i]) for c in calls], root.params["reduce"]))


def _broadcast(calls):
    _agree(calls, "roots", lambda c: c.params["root"])
    _agree(calls, "tensors", lambda c: [_meta(t) for t in c.outputs])
    root = calls[calls[0].params["root"]]
    sources = [_p(t).clone() for t in root.outputs]
    for c in calls:
        if c is not root:
            for out, src in zip(c.outputs, sources):
                _p(out).copy_(src)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return _p(t).reshape(-1)


def _all_gather_into_tensor(calls):
    """``output`` = the inputs of ranks 0..W-1 concatenated (flat, as HCCL's buffers)."""
    w = len(calls)
    _agree(calls, "input tensors", lambda c: [_meta(t) for t in c.inputs])
    for c in calls:
        if c.outputs[0].numel() != w * c.inputs[0].numel() or c.outputs[0].dtype != c.inputs[0].dtype:
            raise CollectiveError(f"rank {c.thread}: output {_meta(c.outputs[0])} must hold {w} x input "
                                  f"{_meta(c.inputs[0])}")
    gathered = torch.cat([_flat(c.inputs[0]) for c in calls])
    for c in calls:
        _p(c.outputs[0]).copy_(gathered.view(c.outputs[0].shape))


def _all_gather(calls):
    """List form: ``outputs[i][r]`` receives rank r's ``inputs[i]``."""
    _agree(calls, "input tensors", lambda c: [_meta(t) for t in c.inputs])
    sources = [[_p(t).clone() for t in c.inputs] for c in calls]
    for c in calls:
        for i, outs in enumerate(c.params["output_lists"]):
            if len(outs) != len(calls):
                raise CollectiveError(f"rank {c.thread}: all_gather needs {len(calls)} output tensors, got {len(outs)}")
            for r, out in enumerate(outs):
                _p(out).copy_(sources[r][i].view(out.shape))


def _reduce_scatter_tensor(calls):
    """Rank r's ``output`` = the reduction over ranks of chunk r of their flat inputs."""
    w = len(calls)
    _agree(calls, "reduce ops", lambda c: c.params["reduce"])
    _agree(calls, "input tensors", lambda c: [_meta(t) for t in c.inputs])
    for c in calls:
        if c.inputs[0].numel() != w * c.outputs[0].numel() or c.outputs[0].dtype != c.inputs[0].dtype:
            raise CollectiveError(f"rank {c.thread}: input {_meta(c.inputs[0])} must hold {w} x output "
                                  f"{_meta(c.outputs[0])}")
    chunks = [_flat(c.inputs[0]).chunk(w) for c in calls]
    for r, c in enumerate(calls):
        reduced = _reduce([ch[r] for ch in chunks], c.params["reduce"])
        _p(c.outputs[0]).copy_(reduced.view(c.outputs[0].shape))


def _reduce_scatter(calls):
    """List form: rank r's ``outputs[i]`` = reduction over ranks q of ``input_lists[i][r]``."""
    _agree(calls, "reduce ops", lambda c: c.params["reduce"])
    _agree(calls, "input tensors", lambda c: [[_meta(t) for t in ts] for ts in c.params["input_lists"]])
    for r, c in enumerate(calls):
        for i, out in enumerate(c.outputs):
            parts = [_p(q.params["input_lists"][i][r]) for q in calls]
            _p(out).copy_(_reduce(parts, c.params["reduce"]).view(out.shape))


def _splits(c: Call, which: str, tensor: torch.Tensor, w: int) -> list:
    sizes = list(c.params[which] or [])
    rows = tensor.shape[0] if tensor.dim() else 1
    if not sizes:
        if rows % w:
            raise CollectiveError(f"rank {c.thread}: {rows} rows do not split evenly over {w} ranks; "
                                  f"pass {which}")
        return [rows // w] * w
    if len(sizes) != w or sum(sizes) != rows:
        raise CollectiveError(f"rank {c.thread}: {which} {sizes} must have {w} entries summing to {rows}")
    return sizes


def _offsets(sizes: list) -> list:
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out


def _all_to_all_single(calls):
    """Rank q sends rows [in_off_q[r], +in_split_q[r]) of its input to rank r, which stores
    them at out_off_r[q] (dim 0); rank r's output_split[q] must equal rank q's input_split[r]."""
    w = len(calls)
    _agree(calls, "dtypes and row shapes", lambda c: (c.inputs[0].dtype, tuple(c.inputs[0].shape[1:])))
    ins = [_splits(c, "input_split_sizes", c.inputs[0], w) for c in calls]
    outs = [_splits(c, "output_split_sizes", c.outputs[0], w) for c in calls]
    for q in range(w):
        for r in range(w):
            if ins[q][r] != outs[r][q]:
                raise CollectiveError(f"rank {calls[q].thread} sends {ins[q][r]} rows to rank {calls[r].thread}, "
                                      f"which expects {outs[r][q]} (input_split_sizes/output_split_sizes)")
    sources = [_p(c.inputs[0]).clone() for c in calls]
    for r, c in enumerate(calls):
        dst, out_off = _p(c.outputs[0]), _offsets(outs[r])
        for q in range(w):
            start = _offsets(ins[q])[r]
            dst[out_off[q]:out_off[q] + outs[r][q]].copy_(sources[q][start:start + ins[q][r]])


def _all_to_all(calls):
    """List form: rank r's ``outputs[q]`` receives rank q's ``inputs[r]``."""
    w = len(calls)
    for c in calls:
        if len(c.inputs) != w or len(c.outputs) != w:
            raise CollectiveError(f"rank {c.thread}: all_to_all needs {w} input and {w} output tensors")
    sources = [[_p(t).clone() for t in c.inputs] for c in calls]
    for r, c in enumerate(calls):
        for q, out in enumerate(c.outputs):
            if _meta(c.inputs[0])[1] != _meta(out)[1] or out.numel() != sources[q][r].numel():
                raise CollectiveError(f"rank {c.thread}: output {q} {_meta(out)} cannot receive rank "
                                      f"{calls[q].thread}'s input {r} {tuple(sources[q][r].shape)}")
            _p(out).copy_(sources[q][r].view(out.shape))


def _gather(calls):
    _agree(calls, "roots", lambda c: c.params["root"])
    root = calls[calls[0].params["root"]]
    if len(root.outputs) != len(calls):
        raise CollectiveError(f"rank {root.thread} (root): gather needs {len(calls)} output tensors")
    for out, c in zip(root.outputs, calls):
        _p(out).copy_(_p(c.inputs[0]).view(out.shape))


def _scatter(calls):
    _agree(calls, "roots", lambda c: c.params["root"])
    root = calls[calls[0].params["root"]]
    if len(root.inputs) != len(calls):
        raise CollectiveError(f"rank {root.thread} (root): scatter needs {len(calls)} input tensors")
    sources = [_p(t).clone() for t in root.inputs]
    for c, src in zip(calls, sources):
        _p(c.outputs[0]).copy_(src.view(c.outputs[0].shape))


def _barrier(calls):
    return None


MATH = {
    "all_reduce": _all_reduce, "reduce": _reduce_to_root, "broadcast": _broadcast,
    "all_gather": _all_gather, "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter": _reduce_scatter, "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all": _all_to_all, "all_to_all_single": _all_to_all_single,
    "gather": _gather, "scatter": _scatter, "barrier": _barrier,
}   # + the MC2 ops' collective math, read off their specs (``OpSpec.mc2_math``) by install()


# ------------------------------------------------------------------ tensors and devices
def _device_of(call: Call, default: int) -> int:
    """The one NPU all of ``call``'s tensors live on (``default`` for a barrier)."""
    tensors = list(call.inputs) + list(call.outputs)
    for t in tensors:
        if not isinstance(t, NpuTensor):
            raise ValueError(f"{call.op}: the HCCL backend takes NPU tensors, got a tensor on {t.device} "
                             f"(move it with .npu())")
    devices = sorted({t.device.index for t in tensors})
    if len(devices) > 1:
        raise ValueError(f"{call.op}: tensors on several devices ({', '.join(f'npu:{d}' for d in devices)}); "
                         f"a rank's collectives use its own NPU")
    return devices[0] if devices else default


# ------------------------------------------------------------------------ MC2 kernels
_mc2_library = None


def install() -> None:
    """Route the multi-rank MC2 ops on NPU tensors to the job (once per process): every op whose spec
    has a multi-rank kernel (``OpSpec.mc2``) gets it on ``AutogradPrivateUse1``, above the NPU
    tensors' Python dispatch, and its collective math (``OpSpec.mc2_math``) joins ``MATH``."""
    global _mc2_library
    if _mc2_library is not None:
        return
    from .ops import library

    _mc2_library = torch.library.Library("npu", "IMPL")
    for spec in list(library.SPECS.values()):
        if spec.mc2 is not None:
            _mc2_library.impl(spec.name, _mc2_kernel(spec), "AutogradPrivateUse1")
        if spec.mc2_math is not None:
            MATH[spec.name] = spec.mc2_math


def _mc2_kernel(spec):
    """The AutogradPrivateUse1 kernel of an op with a multi-rank kernel (``OpSpec.mc2``):
    ``spec.mc2(name, arguments)`` on real NPU tensors; on fake tensors (tracing), or when it returns
    None (a world of one rank, no ``run_ranks``), the ordinary single-device path (the op's math)."""
    import inspect

    signature = inspect.signature(spec.impl)
    base, _, overload = spec.name.partition(".")
    target = getattr(torch.ops.npu, base).__getattr__(overload or "default")

    def kernel(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        tensors = [v for v in a.values() if isinstance(v, torch.Tensor)]
        real = all(isinstance(t, NpuTensor) and t._payload.device.type == "cpu" and
                   type(t._payload) is torch.Tensor for t in tensors)
        result = spec.mc2(spec.name, a) if real else None
        if result is None:
            with torch._C._AutoDispatchBelowAutograd():
                return target(*args, **kwargs)
        return result
    kernel.__name__ = f"{base}_multi_rank"
    return kernel


def mc2_issue(name: str, group: str, arguments: dict, outputs: dict, params: Optional[dict] = None) -> tuple:
    """Issue MC2 op ``name`` of the calling rank on the HCCL communicator named ``group`` and wait
    for its peers; returns the outputs as the rank's NPU tensors, in order.

    ``arguments``: the op's bound arguments (its NPU tensors are what it reads); ``outputs``:
    fresh CPU payloads of its outputs; the op's collective math (``MATH[name]``, its
    ``OpSpec.mc2_math``) fills every rank's outputs once all issued, reading each call's
    ``params``: the arguments' CPU payloads updated with ``params`` (``params["out"]``, default
    ``outputs``, is where to write).
    """
    if name not in MATH:
        raise RuntimeError(f"{name}: no collective math (its OpSpec has no mc2_math)")
    b = binding()
    if b is None:
        raise RuntimeError(f"{name}: a multi-rank call needs the ranks of npugraph.run_ranks(fn); pass the "
                           f"group's HCCL comm name")
    job, rank = b
    comm = job.by_name(group)
    if comm is None:
        raise RuntimeError(f"{name}: {group!r} is not an HCCL communicator of this rank; get it with "
                           f"pg._get_backend(torch.device('npu')).get_hccl_comm_name(rank)")
    payloads = {k: (v._payload if isinstance(v, NpuTensor) else v) for k, v in arguments.items()}
    payloads["out"] = outputs
    payloads.update(params or {})
    inputs = tuple(v for v in arguments.values() if isinstance(v, NpuTensor))
    device = inputs[0].device.index
    wrapped = tuple(wrap(v, device) for v in outputs.values())
    job.issue(comm, rank, Call(name, f"npu::{name}", inputs, wrapped, payloads))
    return wrapped
