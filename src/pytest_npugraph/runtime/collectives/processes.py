"""Ranks as processes: the collectives of a world whose ranks are separate Python processes
(``torch.multiprocessing.spawn``, ``torchrun``-style launches, ``npugraph.run_ranks(fn, processes=True)``).

Why: the thread transport (collectives.Job) matches a collective's members in one address space.
Across processes each rank records and runs its own device work exactly as a rank thread does
(its streams, asynchronous collectives, HCCL modes and cores are the same ``Job`` code); only the
meeting place differs: the c10d store of ``init_process_group`` (``file://``, ``tcp://``,
``env://``: the store gloo would use), under ``npugraph/<world>/``:

* ``arrive/<comm>/<seq>/<group rank>``: a member's side of a collective (op, parameters and the CPU
  payloads it reads), posted when the collective heads the member's stream; it completes on a rank
  once every member posted: that rank runs the collective math (collectives.MATH) on all sides and
  keeps its own outputs.
* ``state/<rank>``: ``running``, ``blocked:<n>`` (its host waits and nothing it holds can run while
  the ``events`` counter is ``n``) or ``done``; ``events`` counts every post.  A rank that sees every
  rank blocked at the current count, or done, knows nothing can ever move: a device hang.  It posts
  ``failure`` and every rank ends with ``DeviceHang`` (on hardware: a hang until the HCCL timeout);
  the deadlock analysis of the merged traces says why.
* ``device/<comm>/<group rank>``: the NPU each member drives (the ``GroupCreated`` record).

A rank that exits finishes first: its queued collectives still complete with their peers (the
process's ``child.write_trace`` at exit).
"""
from __future__ import annotations

import pickle
import time
import uuid
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from ... import trace as T
from .. import collectives as C
from ..callsite import user_site
from ..executor import DeviceHang, Item

_POLL = 0.25


class Side:
    """A tensor of another rank's side of a collective: its CPU payload (what the math reads)."""

    __slots__ = ("_payload",)

    def __init__(self, payload: torch.Tensor):
        self._payload = payload

    def __getattr__(self, name):
        return getattr(self._payload, name)

    def __reduce__(self):
        return (Side, (self._payload,))


def _portable(value):
    """``value`` with NPU tensors replaced by their payloads (``Side``), to pickle."""
    if hasattr(value, "_payload") and isinstance(value, torch.Tensor):
        return Side(value._payload.detach().clone())
    if isinstance(value, Side):
        return Side(value._payload.detach().clone())
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_portable(v) for v in value)
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    return value


class Posted:
    """One rank's collective waiting on its stream for the other processes' sides."""

    def __init__(self, comm: C.Communicator, seq: int, call: C.Call):
        self.comm, self.seq, self.call = comm, seq, call
        self.posted = False
        self.sides: Optional[dict] = None    # group rank -> Call, once every member posted
        self.done = False

    def key(self, grank: int) -> str:
        return f"arrive/{self.comm.name}/{self.seq}/{grank}"

    def describe(self) -> str:
        return f"{self.call.op} #{self.seq} of communicator {self.comm.name!r}"


class ProcessJob(C.Job):
    """This process's rank of a world of processes: ``Job``'s recording and queuing, matched through
    the store."""

    def __init__(self, runtime, size: int, rank: int, store, world: int, timeout: float):
        super().__init__(runtime, size, f"@w{world}" if world else "", bound_devices=False)
        self.rank = rank
        self.store = dist.PrefixStore(f"npugraph/{world}/", store)   # (its timeout is torch's: waits pass their own)
        # one token per world, the first rank's: the parent tells apart two worlds' "hccl/0" (trace_merge)
        token = self.store.compare_set("token", "", uuid.uuid4().hex)
        runtime.extensions.setdefault("collectives.world_tokens", {})[self.label] = \
            token.decode() if isinstance(token, bytes) else token
        self.timeout = timeout
        self.posted: dict = {}          # (comm name, seq) -> Posted
        self.finished = False
        self._state("running")

    # -- store
    def _state(self, value: str) -> None:
        self.store.set(f"state/{self.rank}", value)

    def _bump(self) -> None:
        self.store.add("events", 1)

    def _count(self) -> int:
        return self.store.add("events", 0)

    # -- communicators
    def communicator(self, rank: int, torch_name: str, members: tuple, timeout: float,
                     mode: str = "HOST") -> C.Communicator:
        name = self.comm_name(rank, torch_name)
        comm = self.comms.get(name)
        if comm is None:
            me = tuple(members).index(rank)
            self.store.set(f"device/{name}/{me}", str(self.runtime.current_device()))
            keys = [f"device/{name}/{g}" for g in range(len(members))]
            self.store.wait(keys, timedelta(seconds=min(timeout, self.timeout)))
            devices = tuple(int(self.store.get(k)) for k in keys)
            comm = self.comms[name] = C.Communicator(name, torch_name, tuple(members), timeout, mode, devices)
            self.runtime.marker(T.GroupCreated, group=name, devices=tuple(sorted(set(devices))), site=user_site(4))
        return comm

    # -- collectives
    def _queue(self, comm, seq, rank, call, stream, kseq) -> None:
        p = self.posted[(comm.name, seq)] = Posted(comm, seq, call)
        item = Item(kseq, lambda: self._complete_posted(p), lambda: self._ready_posted(p),
                    f"{p.describe()} issued by rank {rank} at {call.site}")
        self.runtime.executor.enqueue(stream.sid, item)

    def _ready_posted(self, p: Posted) -> bool:
        """The collective heads this rank's stream: post this side once; ready when every side is posted."""
        if self.failure is not None:
            return False
        if not p.posted:
            side = C.Call(p.call.op, p.call.kernel, _portable(p.call.inputs), _portable(p.call.outputs),
                          _portable(p.call.params), p.call.rank, self.rank, p.call.site)
            self.store.set(p.key(p.call.rank), pickle.dumps(side))
            p.posted = True
            self._bump()
        if p.sides is None:
            keys = [p.key(g) for g in range(len(p.comm.members))]
            if not self.store.check(keys):
                return False
            p.sides = {g: pickle.loads(self.store.get(k)) for g, k in enumerate(keys) if g != p.call.rank}
        return all(side.op == p.call.op for side in p.sides.values())   # else: a mismatch, which hangs

    def _complete_posted(self, p: Posted) -> None:
        calls = [p.call if g == p.call.rank else p.sides[g] for g in range(len(p.comm.members))]
        self.posted.pop((p.comm.name, p.seq), None)
        p.done = True
        try:
            C.MATH[p.call.op](calls)
        except C.CollectiveError as exc:
            error = C.CollectiveError(f"{p.describe()}: {exc}\n  " + "\n  ".join(c.where() for c in calls))
            self._post_failure(str(error))
            raise self._fail(error) from None
        p.sides = None
        self._bump()

    # -- host waits
    def host_wait(self, rank: int, until, what: str) -> None:
        ex = self.runtime.executor
        clock = [self._count(), time.monotonic()]

        def blocked():
            self._check_failed()
            seen = self._count()
            ex.drain()
            if until():
                return
            self._state(f"blocked:{seen}")
            failure = self.store.check(["failure"]) and self.store.get("failure").decode()
            if failure:
                raise self._fail(DeviceHang(failure) if failure.startswith("device hang") else
                                 C.CollectiveAborted(f"aborted: another rank ended the job: {failure}"))
            states = self._states()
            if all(s == "done" or s == f"blocked:{seen}" for s in states) and self._count() == seen:
                message = self._hang_message(what, states)
                self._post_failure(message)
                raise self._fail(DeviceHang(message))
            now = time.monotonic()
            if seen != clock[0]:
                clock[0], clock[1] = seen, now
            elif now - clock[1] > self._timeout():
                error = self._stalled(self._timeout())
                self._post_failure(str(error))
                raise self._fail(error)
        try:
            ex.wait(until, blocked, what)
        finally:
            if not self.finished:
                self._state("running")
                self._bump()

    def _states(self) -> list:
        return [self.store.get(f"state/{r}").decode() if self.store.check([f"state/{r}"]) else "starting"
                for r in range(self.size)]

    def _post_failure(self, message: str) -> None:
        if not self.store.check(["failure"]):
            self.store.set("failure", message)
        self._bump()

    def _hang_message(self, what: str, states: list) -> str:
        stuck = []
        for p in sorted(self.posted.values(), key=lambda p: (p.comm.name, p.seq)):
            keys = [p.key(g) for g in range(len(p.comm.members))]
            missing = [p.comm.members[g] for g, k in enumerate(keys) if not self.store.check([k])]
            line = f"{p.describe()} issued by rank {self.rank} at {p.call.site}"
            if missing:
                line += "; not reached by rank " + ", ".join(f"{r} ({states[r]})" for r in missing)
            elif p.sides and any(s.op != p.call.op for s in p.sides.values()):
                line += "; other ranks issued " + ", ".join(f"{s.op} (rank {s.thread} at {s.site})"
                                                            for s in p.sides.values() if s.op != p.call.op)
            stuck.append(line)
        stuck = stuck or [self.runtime.executor.describe_stuck()]
        return (f"device hang: every rank is blocked or finished (rank {self.rank}: {what}). Stuck: "
                + " | ".join(stuck) + ". On hardware the ranks would wait until the HCCL timeout: a communicator "
                "pairs its collectives by issue order, so every member must issue each of them, in the same "
                "order (the deadlock report names the lines).")

    def _stalled(self, timeout: float, where: str = "") -> C.CollectiveError:
        return C.CollectiveError(f"no progress for {timeout:g} s: rank {self.rank} waits and the other ranks "
                                 f"issue nothing (blocked outside torch.distributed?). Set "
                                 f"NPUGRAPH_COLLECTIVE_TIMEOUT to wait longer.")

    # -- the end of this rank
    def finish_process(self) -> None:
        """Before the process exits: its queued work completes with its peers (or hangs), then it is done."""
        if self.finished:
            return
        try:
            ex = self.runtime.executor
            if self.failure is None and ex.pending():
                self.host_wait(self.rank, lambda: not ex.pending(), f"rank {self.rank} exiting")
        finally:
            self.finished = True
            try:
                self._state("done")
                self._bump()
            except Exception:  # noqa: BLE001 (the store's owner, rank 0's process, may be gone)
                pass


# ------------------------------------------------------------------------ this process's world
def current_job() -> Optional[ProcessJob]:
    from ..runtime import peek

    rt = peek()
    bound = None if rt is None else rt.extensions.get("collectives.process")
    return None if bound is None else bound[0]


def world_job(runtime, size: int, rank: int, store, timeout: float) -> ProcessJob:
    """The job of a new default group of this process (a re-initialised world finishes the last one)."""
    previous = current_job()
    if previous is not None:
        previous.finish_process()
    worlds = runtime.extensions.get("collectives.worlds", 0)
    runtime.extensions["collectives.worlds"] = worlds + 1
    job = ProcessJob(runtime, size, rank, store, worlds, timeout)
    runtime.extensions["collectives.process"] = (job, rank)
    return job


def finish_process() -> None:
    job = current_job()
    if job is not None:
        job.finish_process()
