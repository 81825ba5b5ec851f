"""When device work runs: per-stream queues, and the host blocking only where a real one does.

Why: an NPU runs each stream's tasks in order, when their dependencies allow (an event's record,
a collective's peers), while the host goes on issuing.  The trace records *issue* order (that is
what the analyses need); this module decides when each task's CPU math runs, so the values a host
read sees are values hardware could give:

* A task issued on a stream with nothing queued ahead of it runs at once (the common case: no
  cost beyond the synchronous emulator).  Otherwise it joins the stream's queue: a stream waiting
  for an event whose record has not run, or for a collective whose peers have not issued it,
  queues everything after the wait.  Ops then compute their outputs' shapes at issue and their
  values when they reach the head of the queue (``tensor.py``).
* Queued work runs whenever it becomes ready (``drain``): a record when it reaches its queue's
  head, a wait when its record ran, a collective when every member stands at the head of its
  stream (``collectives/``).
* The host blocks (``wait``) only in synchronize, event/stream synchronize, host reads (``.item()``,
  ``.cpu()``, ``nonzero``, ...) and blocking copies.  If the work it waits for can never run (a
  collective a peer never issues, one communicator's collectives in different orders, a wait no
  record will release), the device hangs: the waiting thread gets ``DeviceHang`` (in
  ``run_ranks``: once every rank is blocked or finished) instead of waiting forever; the trace
  already holds what the ``deadlock`` analysis reports.
* ``schedule="shuffle"``: every task is queued and queues drain only at host waits, picking among
  the ready stream heads at random (``seed``), so work of different streams runs in a legal order
  other than issue order: racy code computes different numbers, correct code the same.
"""
from __future__ import annotations

import random
import threading
from collections import deque
from typing import Callable, Optional

SHUFFLE_BATCH = 512    # under shuffle, drain once this many tasks are queued (bounded memory)


class DeviceHang(RuntimeError):
    """Device work the host waits for can never run (on hardware: a hang until the HCCL or stream
    timeout).  ``npugraph.expect("deadlock")`` absorbs it together with the deadlock hazard."""


class Item:
    """A queued task: ``run()`` does its work (None: nothing to compute), ``ready()`` says whether
    it may start once it heads its queue (None: always)."""

    __slots__ = ("seq", "run", "ready", "what")

    def __init__(self, seq: int, run: Optional[Callable], ready: Optional[Callable], what: str):
        self.seq, self.run, self.ready, self.what = seq, run, ready, what


class Executor:
    def __init__(self, lock, schedule: str = "program", seed: int = 0):
        self.cond = threading.Condition(lock)
        self.queues: dict = {}          # sid -> deque[Item]
        self.queued = 0
        self.shuffle = random.Random(seed) if schedule == "shuffle" else None
        self.progress = 0               # bumped whenever a task runs (for waiters)

    # ----------------------------------------------------------------- issuing
    def deferred(self, sid: int) -> bool:
        """Whether work issued on stream ``sid`` now must be queued rather than run at once."""
        return self.shuffle is not None or bool(self.queues.get(sid))

    def idle(self, sid: int) -> bool:
        return not self.queues.get(sid)

    def done(self, sid: int, seq: int) -> bool:
        """Whether the task ``seq`` issued on stream ``sid`` has run."""
        q = self.queues.get(sid)
        return not q or q[0].seq > seq

    def submit(self, sid: int, seq: int, run: Optional[Callable] = None, ready: Optional[Callable] = None,
               what: str = "") -> bool:
        """Issue a task on ``sid``: run it now if nothing is ahead of it and it is ready, else
        queue it.  Returns whether it ran."""
        if self.shuffle is None and ready is None and not self.queues.get(sid):   # the common case: no lock
            if run is not None:
                run()
            self.progress += 1
            return True
        with self.cond:
            q = self.queues.get(sid)
            if not q and self.shuffle is None and (ready is None or ready()):
                if run is not None:
                    run()
                self.progress += 1
                return True
            if q is None:
                q = self.queues[sid] = deque()
            q.append(Item(seq, run, ready, what))
            self.queued += 1
            if self.shuffle is None or self.queued >= SHUFFLE_BATCH:
                self.drain()
            return False

    def enqueue(self, sid: int, item: Item) -> None:
        """Queue ``item`` on ``sid`` even if the stream is idle (a collective waits there for its
        peers), then run what can run."""
        with self.cond:
            self.queues.setdefault(sid, deque()).append(item)
            self.queued += 1
            if self.shuffle is None or self.queued >= SHUFFLE_BATCH:
                self.drain()

    def abandon(self) -> None:
        """Drop every queued task (after a reported hang: the test goes on without that work)."""
        with self.cond:
            self.queues.clear()
            self.queued = 0
            self.cond.notify_all()

    # ---------------------------------------------------------------- running
    def drain(self) -> bool:
        """Run every queued task that can run (ready heads, repeatedly); True if any ran."""
        ran = False
        with self.cond:
            rng = self.shuffle
            while True:
                heads = [sid for sid, q in self.queues.items() if q]
                if rng is not None:
                    rng.shuffle(heads)
                step = False
                for sid in heads:
                    q = self.queues[sid]
                    while q:
                        item = q[0]
                        if item.ready is not None and not item.ready():
                            break
                        if item.run is not None:
                            item.run()
                        if q and q[0] is item:    # (a collective's run pops its members itself)
                            q.popleft()
                            self.queued -= 1
                        step = ran = True
                        self.progress += 1
                        if rng is not None and rng.random() < 0.5:
                            break       # let another stream go next
                if not step:
                    break
            if ran:
                self.cond.notify_all()
        return ran

    def pop_head(self, sid: int, item: Item) -> None:
        """Remove ``item`` (a collective member that another stream's head completed) from the head
        of its queue.  A task leaves its queue only after its work ran: other host threads check
        ``idle``/``deferred`` without the lock, and an empty queue tells them its values are there."""
        q = self.queues.get(sid)
        if q and q[0] is item:
            q.popleft()
            self.queued -= 1
            self.progress += 1

    def head(self, sid: int) -> Optional[Item]:
        q = self.queues.get(sid)
        return q[0] if q else None

    def pending(self) -> list:
        """``(sid, Item)`` of every task still queued, heads first."""
        return [(sid, item) for sid, q in self.queues.items() for item in q]

    # ---------------------------------------------------------------- waiting
    def wait(self, until: Callable[[], bool], blocked: Optional[Callable[[], None]] = None,
             what: str = "the host") -> None:
        """Block the calling host thread until ``until()`` (drain first).  ``blocked()`` is called
        (under the lock) each time nothing can run in this thread: it raises ``DeviceHang`` when no
        other thread can make progress either; without it, that is at once."""
        with self.cond:
            while True:
                self.drain()
                if until():
                    return
                if blocked is None:
                    error = DeviceHang(f"device hang: {what} waits for device work that can never run: "
                                       f"{self.describe_stuck()}")
                    self.abandon()
                    raise error
                seen = self.progress
                blocked()
                if self.progress == seen:
                    self.cond.wait(0.25)

    def describe_stuck(self) -> str:
        heads = [item.what or f"task #{item.seq}" for _, q in self.queues.items() if q for item in (q[0],)]
        return "; ".join(heads) or "nothing queued"
