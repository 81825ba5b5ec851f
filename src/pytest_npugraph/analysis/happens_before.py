"""Happens-before over a trace: one vector clock per stream plus one for the host.

Why: every cross-stream check (races, missing ``record_stream``, capture joins, and the
core-limit, deadlock and replay analyses) asks the same question, "must A have finished
before B starts, in every schedule the device may pick?".  This module answers it once,
in one pass over ``trace.records``.

Model (CSAN's, §1.4/1.5 of the anchors, made exact for host issue order)
-----------------------------------------------------------------------
* Stream tasks are ``Kernel``, ``EventRecord`` and ``EventWait``; each runs on its stream
  in FIFO order.  Everything else is a host action at its place in program order.
* A clock maps a dense stream index to the highest ``seq`` of that stream known to have
  completed (-1: nothing).  ``seq`` is global, so per stream it only grows.
* A task cannot start before the host issued it, and the host issues it after everything
  the host has observed: so each stream task starts from (merges) the host clock.  This
  covers CSAN's "a new stream starts from the host clock" and "after a synchronize every
  stream is ordered after it" exactly: tasks issued before the sync are not affected.
* ``EventRecord``: the event's clock := the stream's clock with the record itself
  (a re-record overwrites).  ``EventWait``: the stream merges the event's latest record;
  waiting on a never-recorded event orders nothing.  An ``ExternalEvent`` waited before its
  record waits for that later record: ``analyze`` hands every analysis the trace in an order
  where such a wait follows its record (external_waits.py), so this pass stays one forward pass.
* ``HostSync``: ``device`` -> the host learns every stream of that device; ``stream`` /
  ``read`` -> that stream (the whole device if ``stream`` is None); ``event`` -> the
  event's latest record.
* ``Alloc(reuses=X)`` of a block freed after ``record_stream(X, B)`` (B other than X's
  allocation stream): the allocator hands out the address only once the events it recorded
  on each such B at the ``Free`` have completed (torch_npu_api.md §5), so the host learns
  B's clock as of that free.

Why ``taskgraph`` is a second model (and where the two differ)
------------------------------------------------------------
This one answers "ordered(a, b)?" for any pair in O(1) after one pass; the memory analyses (races,
missing ``record_stream``, host races, replay overwrites, reinplace, SuperKernel) need only that.
``taskgraph`` builds the explicit per-stream task queues and dependency edges that the deadlock
search executes with core occupancy, which clocks cannot express.  They agree on stream order and
events.  They differ on purpose on two points: (1) a ``HostSync`` here advances one host clock for
every later task (a test drives its devices from one host thread, so tasks issued after a sync
follow it whatever their device), while ``taskgraph`` confines a sync to the synced device because
under ``run_ranks`` each device has its own host thread and the deadlock search must not order one
rank after another's sync; memory is per device, so the races never compare the tasks of two
devices and the wider host order here cannot hide one.  (2) ``taskgraph`` joins the members of a
collective (all complete together), which only matters across devices.  The oracles check each
against brute force: tests/analysis/test_oracle.py and tests/analysis_cores/test_oracle.py.

Storage: the clock of a stream only changes at waits and host merges, so consecutive tasks
share one tuple; a record keeps a reference to the clock it ran with (the host clock for
host records) and its own stream's entry is implicit (its own ``seq``).
"""
from __future__ import annotations

from ..trace import Alloc, EventRecord, EventWait, Free, HostSync, Kernel
from . import memory

TASKS = (Kernel, EventRecord, EventWait)
NOTHING = -1


def _join(a: tuple, b: tuple) -> tuple:
    return tuple(map(max, a, b))


class HappensBefore:
    """Vector clocks of a trace, computed once in ``__init__``.

    Public attributes (read-only; other analyses use them in their own hot loops):

    * ``index``: ``sid -> dense stream index``; ``sids``: the inverse list.
    * ``clocks[pos]``: the clock record ``trace.records[pos]`` ran with.  For a stream task
      it is its stream's clock when the task starts (after the wait, for an ``EventWait``);
      entry ``clocks[pos][index[t]] >= seq`` means task ``seq`` of stream ``t`` finished
      before it.  The entry of the task's own stream is stale: use ``clock()`` for a full
      copy.  For a host record it is the host clock after the record.
    """

    def __init__(self, trace, facts: memory.MemoryFacts | None = None) -> None:
        self.trace = trace
        self.records = trace.records
        self.memory = facts if facts is not None else memory.compute(trace)   # frees, record_stream, reuse
        self.sids: list = list(trace.streams)
        self.index: dict = {sid: i for i, sid in enumerate(self.sids)}
        self.clocks: list = [None] * len(self.records)
        self._pos = None  # seq -> position, only when seqs are not record positions
        self._run()

    # ------------------------------------------------------------------ queries
    def position(self, seq: int) -> int:
        return seq if self._pos is None else self._pos[seq]

    def ordered(self, a: int, b: int) -> bool:
        """True iff record ``a`` happens before record ``b`` (both ``seq``): in every schedule
        ``a`` has completed before ``b`` starts.  False for ``a == b``."""
        pa, pb = self.position(a), self.position(b)
        if pa >= pb:
            return False  # nothing issued later can be waited for by something issued earlier
        ra, rb = self.records[pa], self.records[pb]
        if type(ra) not in TASKS:
            return True  # a host action precedes everything the host issues after it
        if type(rb) in TASKS and ra.stream == rb.stream:
            return True
        i = self.index[ra.stream]
        clock = self.clocks[pb]
        return i < len(clock) and clock[i] >= ra.seq

    def clock(self, seq: int) -> dict:
        """``{sid: highest seq known complete}`` as seen by record ``seq`` (own stream included)."""
        pos = self.position(seq)
        rec = self.records[pos]
        known = {self.sids[i]: v for i, v in enumerate(self.clocks[pos]) if v != NOTHING}
        if type(rec) in TASKS:
            known[rec.stream] = rec.seq
        return known

    # ------------------------------------------------------------------ the pass
    def _run(self) -> None:
        n = len(self.sids)
        host = (NOTHING,) * n
        host_version = 0
        ext = [host] * n            # per stream: clock (own entry stale, see class doc)
        seen = [0] * n              # host_version each stream last merged
        last = [NOTHING] * n        # seq of each stream's latest task
        events: dict = {}           # eid -> clock of its latest record
        recorded_at_free = self.memory.recorded_at_free
        blocks = self.trace.blocks
        covers: dict = {}           # freed bid -> clock the allocator waits for before reuse
        device_of = {i: self.trace.streams[sid].device for i, sid in enumerate(self.sids)}
        index, clocks = self.index, self.clocks

        def grow(sid: int) -> int:
            """A stream missing from ``trace.streams``: widen every live clock by one entry."""
            nonlocal host
            i = index[sid] = len(self.sids)
            self.sids.append(sid)
            device_of[i] = None
            pad = (NOTHING,)
            host = host + pad
            ext[:] = [c + pad for c in ext]
            ext.append(host)
            seen.append(host_version)
            last.append(NOTHING)
            for table in (events, covers):
                for k, c in table.items():
                    table[k] = c + pad
            return i

        def completed(i: int) -> tuple:
            """Stream ``i``'s clock including its own latest task."""
            c = list(ext[i])
            c[i] = last[i]
            return tuple(c)

        for pos, rec in enumerate(self.records):
            if rec.seq != pos and self._pos is None:
                self._pos = {r.seq: p for p, r in enumerate(self.records)}
            cls = type(rec)
            if cls is Kernel or cls is EventRecord or cls is EventWait:
                s = index.get(rec.stream)
                if s is None:
                    s = grow(rec.stream)
                c = ext[s]
                if seen[s] != host_version:
                    seen[s] = host_version
                    c = _join(c, host)
                if cls is EventWait:
                    ev = events.get(rec.event)
                    if ev is not None:
                        c = _join(c, ev)
                elif cls is EventRecord:
                    rc = list(c)
                    rc[s] = rec.seq
                    events[rec.event] = tuple(rc)
                ext[s] = c
                last[s] = rec.seq
                clocks[pos] = c
                continue
            learned = None
            if cls is HostSync:
                learned = self._sync_clock(rec, index, device_of, events, completed)
            elif cls is Free:
                info = blocks.get(rec.block)
                owner = info.stream if info is not None else None
                streams = [index[sid] for sid in recorded_at_free(rec.block) if sid in index and sid != owner]
                if streams:
                    covers[rec.block] = _fold(completed(i) for i in streams)
            elif cls is Alloc and rec.reuses is not None:
                learned = covers.pop(rec.reuses, None)
            if learned is not None:
                joined = _join(host, learned)
                if joined != host:
                    host = joined
                    host_version += 1
            clocks[pos] = host

    @staticmethod
    def _sync_clock(rec, index, device_of, events, completed):
        if rec.what == "event":
            return events.get(rec.event)
        if rec.what in ("stream", "read") and rec.stream is not None:
            i = index.get(rec.stream)
            return None if i is None else completed(i)
        if rec.what not in ("device", "stream", "read"):
            return None  # an unknown kind of sync: assume it orders nothing
        streams = [i for i, d in device_of.items() if d == rec.device]
        return _fold(completed(i) for i in streams) if streams else None


def _fold(clocks) -> tuple:
    result = None
    for c in clocks:
        result = c if result is None else _join(result, c)
    return result


def memo(cache: dict | None, name: str, trace, compute):
    """``compute(trace)``, once per ``cache`` (the dict ``analysis.analyze`` shares between the
    analyses of one trace) while ``trace`` keeps its length; always fresh without a cache."""
    if cache is None:
        return compute(trace)
    hit = cache.get(name)
    if hit is None or hit[0] is not trace or hit[1] != len(trace.records):
        hit = cache[name] = (trace, len(trace.records), compute(trace))
    return hit[2]


def of(trace, cache: dict | None = None) -> HappensBefore:
    """The shared ``HappensBefore`` of ``trace`` (see ``memo``)."""
    return memo(cache, "happens_before", trace, HappensBefore)
