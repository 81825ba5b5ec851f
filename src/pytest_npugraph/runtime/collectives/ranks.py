"""The ranks of a job and the collectives between them: communicators, each rank's side of a
collective (``Call``), and ``Job``, which records every collective on its rank's stream, queues it there
and completes it with its peers (its math: c10d_math.MATH), and ends a job that can never move with
``DeviceHang`` (the package docstring says how).  Its transports: threads.py (rank threads in the test's
process) and processes.py (rank processes, through the c10d store).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Optional

from ... import trace as T
from ..._context import CONTEXT
from ...errors import NotEmulated
from .. import hccl_modes, profiles
from ..callsite import user_site
from ..executor import DeviceHang, Item
from ..tensor import NpuTensor, span
from .c10d_math import MATH
from .errors import CollectiveAborted, CollectiveError

DEFAULT_TIMEOUT = float(os.environ.get("NPUGRAPH_COLLECTIVE_TIMEOUT", "30"))
_POLL = 0.25          # seconds between a waiting rank's looks at the clock (the last resort)


# ----------------------------------------------------------------------------- records
@dataclass(eq=False)
class Communicator:
    """An HCCL communicator: one ``torch.distributed`` group of one job."""

    name: str             # the trace group and the HCCL comm name ("hccl/0", "hccl/1@2", ...)
    torch_name: str       # torch.distributed's group name ("0", "1", ...)
    members: tuple        # the rank (thread / device) of each group rank
    timeout: float
    mode: str = "HOST"    # HCCL op expansion mode of its collectives (hccl_modes.py)
    devices: tuple = ()   # the NPU each group rank drives (() : rank r drives npu:r)

    def device(self, grank: int) -> int:
        return self.devices[grank] if self.devices else self.members[grank]


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
        return f"rank {self.thread} issued {self.kernel.split('::')[-1] if self.op == 'p2p' else self.op} at {self.site}"


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
        if self.op == "p2p":
            src, dst = self.comm.members
            return f"send #{self.seq} from rank {src} to rank {dst} ({self.comm.name!r})"
        return f"{self.op} #{self.seq} of communicator {self.comm.name!r}"

    def missing(self) -> list:
        return [t for r, t in enumerate(self.comm.members) if r not in self.calls]


def binding():
    """``(job, rank)`` of the calling thread: its run_ranks rank, else the rank of this process
    (processes.py), else None."""
    from ..runtime import peek

    rt = peek()
    if rt is None:
        return None
    return rt.thread().rank or rt.extensions.get("collectives.process")


def claim_world(runtime) -> int:
    """The number of a new world of ranks in the test's trace (1: the first).  Thread jobs (``@n``) and
    the worlds of rank processes the test absorbs (``~n``, inherit.py) count together, so no two worlds
    of one test name a communicator alike (the analyses pair collectives by communicator name)."""
    n = runtime.extensions.get("collectives.jobs", 0) + 1
    runtime.extensions["collectives.jobs"] = n
    return n


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
    def comm_name(self, rank: int, torch_name: str) -> str:
        """The name of the communicator rank ``rank`` creates for group ``torch_name`` now: the n-th
        creation of a group (re-initialisation) is ``.n``, a later job of the test adds its label."""
        key = (rank, torch_name)
        n = self.incarnations.get(key, 0)
        self.incarnations[key] = n + 1
        return f"hccl/{torch_name}" + (f".{n}" if n else "") + self.label

    def communicator(self, rank: int, torch_name: str, members: tuple, timeout: float,
                     mode: str = "HOST") -> Communicator:
        """The communicator of group ``torch_name`` as rank ``rank`` creates it (collectively:
        every member creates its groups in the same order, so the n-th creation matches)."""
        with self.cond:
            name = self.comm_name(rank, torch_name)
            comm = self.comms.get(name)
            if comm is None:
                comm = self.comms[name] = Communicator(name, torch_name, tuple(members), timeout, mode,
                                                       () if self.bound_devices else
                                                       (self.runtime.current_device(),) * len(members))
                devices = tuple(sorted(set(comm.device(g) for g in range(len(members)))))
                self.runtime.marker(T.GroupCreated, group=name, devices=devices, site=user_site(4))
            elif comm.members != tuple(members):
                raise self._fail(CollectiveError(
                    f"rank {rank} created process group {torch_name!r} with ranks {list(members)}, but "
                    f"another rank created it with ranks {list(comm.members)}: every rank must call "
                    f"new_group with the same ranks, in the same order"))
            return comm

    def by_name(self, name: str) -> Optional[Communicator]:
        return self.comms.get(name)

    # -- point-to-point
    def pair(self, comm: Communicator, src: int, dst: int) -> Communicator:
        """The channel of ``comm``'s sends from group rank ``src`` to ``dst``: HCCL pairs the n-th send
        from src to dst with dst's n-th receive from src, so each direction numbers its own (a
        two-member communicator, ``<comm>/p2p:<src>-><dst>``, with its ``GroupCreated``)."""
        name = f"{comm.name}/p2p:{comm.members[src]}->{comm.members[dst]}"
        with self.cond:
            channel = self.comms.get(name)
            if channel is None:
                devices = (comm.device(src), comm.device(dst))
                channel = self.comms[name] = Communicator(name, comm.torch_name, (comm.members[src], comm.members[dst]),
                                                          comm.timeout, comm.mode, devices)
                self.runtime.marker(T.GroupCreated, group=name, devices=tuple(sorted(set(devices))),
                                    site=user_site(5))
            return channel

    def point_to_point(self, comm: Communicator, rank: int, kind: str, tensor, peer: int) -> None:
        """Rank ``rank``'s ``kind`` ("send" / "recv") of ``tensor`` to / from group rank ``peer``:
        a task on its current stream that completes when the peer's matching receive / send also
        heads its stream (a send nobody receives never completes: a device hang, not a wait)."""
        me = comm.members.index(rank)
        if peer == me or not 0 <= peer < len(comm.members):
            raise ValueError(f"{kind}: invalid peer rank {peer} for rank {me} of a group of {len(comm.members)}")
        src, dst = (me, peer) if kind == "send" else (peer, me)
        call = Call("p2p", f"hccl::{kind}", (tensor,) if kind == "send" else (),
                    (tensor,) if kind == "recv" else (), {"kind": kind})
        self.issue(self.pair(comm, src, dst), rank, call)

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
        call.site = rt.site_hint() or user_site(3)     # a compiled graph's node: its line in the model
        with self.cond:
            self._check_failed()     # a rank the job gave up on issues nothing more
            seq = self.seqs.get((comm.name, rank), 0)
            self.seqs[(comm.name, rank)] = seq + 1
        reads = [s for s in map(span, call.inputs) if s is not None]
        writes = [s for s in map(span, call.outputs) if s is not None]
        kseq = rt.kernel(stream, call.kernel, reads, writes, cores=cores, site=call.site,
                         collective=(comm.name, seq))
        self._queue(comm, seq, rank, call, stream, kseq)

    def _queue(self, comm: Communicator, seq: int, rank: int, call: Call, stream, kseq: int) -> None:
        """Queue the recorded collective on its stream, to complete with its peers' (``_ready``)."""
        rt = self.runtime
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
            # in rank order, not the order the ranks happened to issue it (a verdict's text is stable)
            calls = sorted(p.calls.values(), key=lambda c: c.thread)
            issued = ", ".join(f"rank {c.thread} at {c.site}" for c in calls)
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


# ----------------------------------------------------------------------------- profile
def op_cores(op: str, device, mode: Optional[str] = None) -> T.OpCores:
    """Cores of collective ``op`` ("hccl::all_reduce"): the users' hook (asked on every call),
    else the op's spec (MC2 ops: every vector core), else what its communicator's HCCL
    expansion ``mode`` takes (hccl_modes.py; None: the chip's default mode)."""
    name = op.split("::")[-1]
    spec = CONTEXT.op_profile(name)
    if spec is None:
        from ..ops import library

        spec = library.cores_of(name)
    if spec is None:
        chip = device.profile.name
        spec = hccl_modes.profile(name, mode or hccl_modes.default_mode(chip), chip)
    return profiles.to_cores(spec, device)


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
