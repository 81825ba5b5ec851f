"""The per-test emulated machine: devices, the calling thread's current device and streams,
and the trace every analysis reads.

``current()`` returns the runtime of the running test, building a fresh one whenever the
plugin has started a new test (``_context.CONTEXT.generation``), so nothing leaks between tests.
"""
from __future__ import annotations

import bisect
import contextlib
import itertools
import sys
import threading
from typing import Any, Optional

from .. import trace as T
from ..trace import ALLOC_ROW, FREE_ROW, KERNEL_ROW
from .._context import CONTEXT
from torch._C._autograd import _get_sequence_nr as sequence_nr

from .callsite import first_user, user_site
from .device import Device
from .executor import DeviceHang, Executor
from .stash import Stash, ThreadState
from .streams import EventState, StreamState

_ids = itertools.count(1)   # process-wide, so handles from an older test never collide


class Runtime:
    def __init__(self, config, generation: int = 0):
        self.config = config
        self.generation = generation
        self.trace = T.Trace()
        self.lock = threading.RLock()
        self._threads = threading.local()     # .state: this thread's ThreadState in this test
        self.stash = Stash()                  # per-test state of long-lived objects (stash.py)
        self.executor = Executor(self.lock, getattr(config, "schedule", "program"),
                                 getattr(config, "schedule_seed", 0))   # when device work runs
        self.stream_marks: dict = {}     # sid -> seq of the latest record issued on it
        self.host_known: dict = {}       # sid -> mark the host knows completed
        self.queried: dict = {}          # ("stream", sid) / ("event", eid) -> (mark asked about, unanswered asks)
        self.freed_ranges: dict = {}     # device -> sorted list of (lo, hi, bid) of freed blocks
        self.graphs: list = []           # graph records (npugraph.graphs)
        self.tagged_events: dict = {}    # torchair tag -> Event
        self.extensions: dict = {}       # per-test state owned by shims (torchair registries, ...)
        self.generators: dict = {}       # device -> its default random generator (generators.py)
        self.routed_pools = 0            # use_mem_pool blocks open in any thread (route_pool)
        self.devices = [Device(i, config.chip, self) for i in range(config.device_count)]
        if getattr(config, "rank_skew", None) is not None:      # run_ranks threads' skews (skew.py)
            from . import skew

            skew.install(self, config.rank_skew)
        for d in self.devices:
            self.marker(T.DeviceCores, device=d.index, cube=d.cube_cores, vector=d.vector_cores)

    # ------------------------------------------------------------------ identities
    def new_block_id(self) -> int:
        return next(_ids)

    def new_block_ids(self, n: int) -> list:
        """``n`` new block ids, increasing (a planned run's blocks: alloc_schedule.py)."""
        return list(itertools.islice(_ids, n))

    def new_stream(self, device: int, stream_id: int, label: str, **kw) -> StreamState:
        state = StreamState(next(_ids), device, stream_id, label, **kw)
        self.trace.streams[state.sid] = T.StreamInfo(state.sid, device, stream_id, label)
        return state

    def name_stream(self, state: StreamState, name: str) -> None:
        """Name ``state`` as the user named it, for every report, HTML page and timeline:
        ``npu:0/decode_step:tag '7' (stream-1)`` for the stream an ``npu_stream_switch("7")`` scope
        of the reduce-overhead graph of ``decode_step`` runs on (``graph_names``); the pool stream it is stays in parentheses (the
        same pool stream serves eager code after 32 more streams, as on hardware)."""
        physical = state.physical_label = state.physical_label or state.label
        device, _, local = physical.partition("/")
        state.label = f"{device}/{name} ({local})"
        info = self.trace.streams.get(state.sid)
        if info is not None:
            self.trace.streams[state.sid] = T.StreamInfo(info.sid, info.device, info.stream_id, state.label)

    def stream_made_at(self, state: StreamState, site) -> None:
        """Remember the user's line that made an eager stream (the first ``torch.npu.Stream()`` of this
        test that got this pool stream): ``npu:0/stream-1 (made at test_x.py:12)`` in timelines and
        the HTML report, and a ``made at`` line under a report that names the stream."""
        info = self.trace.streams.get(state.sid)
        if info is not None and info.site == T.UNKNOWN_SITE and site != T.UNKNOWN_SITE:
            self.trace.streams[state.sid] = T.StreamInfo(info.sid, info.device, info.stream_id, info.label, site)

    def new_event(self, label: str, *, external=False, enable_timing=False, tag=None, numbered=True) -> EventState:
        """Labels number the events a host thread made in this test ("Event#2", "Event#1 of rank 1"): not
        the process-wide id, which depends on earlier tests and, under ``run_ranks``, on thread timing.
        ``numbered=False``: an event the runtime makes for itself (autograd's), which takes no number."""
        state = EventState(next(_ids), label, enable_timing=enable_timing, external=external)
        if tag is None and numbered:
            thread = self.thread()
            thread.events_made += 1
            rank = "" if thread.rank is None else f" of rank {thread.rank[1]}"
            label = f"{label}#{thread.events_made}{rank}"
        state.label = label
        self.trace.events[state.eid] = T.EventInfo(state.eid, state.label, user_site(3), external, tag)
        return state

    # ------------------------------------------------------ current device/stream
    def thread(self) -> ThreadState:
        """The calling host thread's state in this test."""
        try:
            return self._threads.state
        except AttributeError:
            state = self._threads.state = ThreadState()
            return state

    def allocation_pool(self, stream: StreamState, device: int):
        """The pool a new block on ``stream`` comes from: the capture's, else the pool
        ``torch.npu.use_mem_pool`` routes this thread's allocations on ``device`` into, else the
        device's own (None).  Every op allocates: with no routing open it is one attribute test."""
        capture = stream.capture
        if capture is not None:
            return capture.pool
        return self.thread().mem_pools.get(device) if self.routed_pools else None

    def route_pool(self, device: int, pool) -> Any:
        """Route this thread's allocations on ``device`` into ``pool`` (None: back to the device's
        own); returns the previous routing, to give back when the block ends."""
        pools = self.thread().mem_pools
        previous = pools.get(device)
        if pool is None:
            pools.pop(device, None)
        else:
            pools[device] = pool
        self.routed_pools += (pool is not None) - (previous is not None)
        return previous

    def check_allocation(self, device: int, nbytes: int) -> StreamState:
        """Raise the NPU's ``OutOfMemoryError`` now if ``nbytes`` cannot be allocated on ``device``'s
        current stream (asked before a big CPU payload is made); returns that stream."""
        stream = self.current_stream(device)
        pool = self.allocation_pool(stream, device)
        allocator = self.devices[device].allocator
        if nbytes and not allocator.fits(nbytes, stream.sid, pool):
            allocator.free(allocator.malloc(nbytes, stream.sid, pool))   # raises OutOfMemoryError
        return stream

    def device(self, index: Optional[int] = None) -> Device:
        if index is None:
            index = self.current_device()
        if index < 0:
            from .errors import ErrCode, pta_error

            raise RuntimeError(f"Invalid device index {index}" + pta_error(ErrCode.VALUE))
        if index >= len(self.devices):
            # only an object from an earlier test can name a device this test lacks (the API checks indices)
            raise RuntimeError(
                f"npu:{index} does not exist in the running test's emulated machine ({len(self.devices)} device(s)): "
                f"a tensor, stream or event made by an earlier test with more devices (module-level or cached "
                f"state) is used here. Make NPU objects inside the test or a fixture, or give this test the "
                f"devices with @pytest.mark.npu_devices({index + 1}).")
        return self.devices[index]

    def stream_by_id(self, device: int, stream_id: int) -> StreamState:
        if not 0 <= device < len(self.devices):
            from .errors import ErrCode, pta_error

            raise RuntimeError(f"Invalid device index {device}" + pta_error(ErrCode.VALUE))
        return self.devices[device].stream_by_id(stream_id)

    def check_device(self, index: int, call: str = "aclrtSetDevice") -> None:
        """Raise the ACL error a real runtime gives for a device this machine does not have."""
        if index < 0 or index >= len(self.devices):
            from .errors import ErrCode, pta_error

            raise RuntimeError(f"{call} failed, error code is 107001\n[Error]: invalid device id {index}: the "
                               f"emulated machine has {len(self.devices)} device(s) (set more with "
                               f"@pytest.mark.npu_devices(N))" + pta_error(ErrCode.ACL))

    def local_device(self) -> int:
        """The calling thread's device, -1 when it never set one (``_npu_getLocalDevice``)."""
        device = self.thread().device
        return -1 if device is None else device

    def current_device(self) -> int:
        device = self.thread().device
        return 0 if device is None else device

    def set_current_device(self, index: int) -> None:
        self.thread().device = index

    def current_stream(self, device: Optional[int] = None) -> StreamState:
        d = self.device(device)
        return self.thread().streams.get(d.index, d.default_stream)

    def set_current_stream(self, state: StreamState) -> None:
        thread = self.thread()
        thread.streams[state.device] = state
        # which stream the autograd nodes this thread records from now on belong to (autograd_streams.py)
        history = thread.stream_history.setdefault(state.device, [])
        seq = sequence_nr()
        if history and history[-1][0] == seq:
            history[-1] = (seq, state)
        elif not history or history[-1][1] is not state:
            history.append((seq, state))

    # ------------------------------------------------------------------- recording
    def _append(self, record) -> None:
        self.trace.log.append(record)

    def _seq(self) -> int:
        return len(self.trace.log)

    @contextlib.contextmanager
    def restored_limits(self):
        """Around TorchAir's restore of a stream's core limits after a ``limit_core_num`` scope (it sets
        back what ``get_stream_limit`` read, the device maximum when nobody had set a limit): a limit
        set back to the maximum is no limit, while a user's own ``set_stream_limit`` to the maximum
        counts in the documented core rule."""
        state = self.thread()
        state.restoring_limits, before = True, state.restoring_limits
        try:
            yield
        finally:
            state.restoring_limits = before

    def site_hint(self):
        """The user's line for work issued on this thread's behalf (a compiled graph's node line)."""
        return self.thread().site

    def set_site_hint(self, site) -> None:
        self.thread().site = site

    def kernel(self, stream: StreamState, op: str, reads=(), writes=(), *, cores=T.OpCores(),
               site=None, graph=None, collective=None) -> int:
        return self.kernel_now(stream, op, tuple(map(T.Span.row, reads)), tuple(map(T.Span.row, writes)), cores,
                               site or self.site_hint() or user_site(3), graph, collective)

    def kernel_now(self, stream, op, reads: tuple, writes: tuple, cores, site, graph=None, collective=None) -> int:
        """``kernel`` with everything worked out (the eager op path): ``reads`` and ``writes`` are span
        rows (``Span.row``); the task is logged as a row (``trace.KERNEL_ROW``)."""
        cube, vector = stream.cube_limit, stream.vector_limit
        if cube is None or vector is None:
            cube, vector = self.devices[stream.device].explicit_limits(stream)
        trace = self.trace
        ids = trace.object_ids
        with self.lock:
            site_i = ids.get(id(site))
            if site_i is None:
                site_i = trace.intern(site)
            cores_i = ids.get(id(cores))
            if cores_i is None:
                cores_i = trace.intern(cores)
            log = trace.log
            seq = len(log)
            log.append((KERNEL_ROW, stream.sid, op, reads, writes, site_i, cores_i, cube, vector,
                        None if graph is None else trace.intern(graph), collective))
            self.stream_marks[stream.sid] = seq
            return seq

    def record_event(self, event: EventState, stream: StreamState, site=None) -> None:
        site = site or self.site_hint() or user_site(3)
        if stream.capture is not None:          # a graph node, not a task of its own (graphs.py)
            stream.capture.record(event, stream, site)
        else:
            self._record_now(event, stream, site)

    def _record_now(self, event: EventState, stream: StreamState, site) -> None:
        with self.lock:
            seq = self._seq()
            self._append(T.EventRecord(seq, stream.sid, event.eid, site))
            self.stream_marks[stream.sid] = seq
            event.device = stream.device
            event.record_stream = stream.sid
            event.record_mark = seq
            event.waits_since_record = 0
            event.stamp()
            self.executor.submit(stream.sid, seq, what=f"record of {event.label}")

    def wait_event(self, event: EventState, stream: StreamState, site=None) -> None:
        site = site or self.site_hint() or user_site(3)
        capture = stream.capture or getattr(event, "capture", None)
        if capture is not None:                 # waiting on a captured record joins the capture
            capture.wait(event, stream, site)
        else:
            self._wait_now(event, stream, site)

    def _wait_now(self, event: EventState, stream: StreamState, site) -> None:
        with self.lock:
            seq = self._seq()
            self._append(T.EventWait(seq, stream.sid, event.eid, site))
            self.stream_marks[stream.sid] = seq
            event.waits_since_record += 1
            ready = None
            ex = self.executor
            if event.recorded:
                sid, mark = event.record_stream, event.record_mark
                if not ex.done(sid, mark):
                    ready = lambda: ex.done(sid, mark)   # noqa: E731
            elif event.external:   # an ExternalEvent's wait holds the stream until a record comes and runs
                ready = lambda: event.recorded and ex.done(event.record_stream, event.record_mark)  # noqa: E731
            self.executor.submit(stream.sid, seq, ready=ready, what=f"wait for {event.label} at {site}")

    def host_sync(self, what: str, *, device: int = 0, stream: Optional[StreamState] = None,
                  event: Optional[EventState] = None, site=None) -> None:
        site = site or user_site(3)
        if what != "stream":     # Stream.synchronize/query refuse themselves; a blocking H2D copy is let through
            self.refuse_sync_in_capture(what, device, stream, event)

        def append():
            self._append(T.HostSync(self._seq(), what, device, stream.sid if stream else None,
                                    event.eid if event else None, site))
        try:
            self.host_wait(self.synced(what, device, stream, event), f"the host ({what} sync at {site})")
        except DeviceHang:      # the sync that never returns is in the trace too: the analyses say why
            with self.lock:
                append()
            raise
        with self.lock:
            append()
            if what == "device":
                for s in self.devices[device].streams.values():
                    self._learn(s.sid, self.stream_marks.get(s.sid, -1))
            elif stream is not None:
                self._learn(stream.sid, self.stream_marks.get(stream.sid, -1))
            elif event is not None and event.recorded:
                self._learn(event.record_stream, event.record_mark)

    QUERY_SPIN_LIMIT = 1000   # identical unanswered queries, nothing else happening: the host is blocked

    def query(self, stream: Optional[StreamState] = None, event: Optional[EventState] = None, site=None) -> bool:
        """``Stream.query()`` / ``Event.query()``: whether the stream's work (the event's latest record)
        has run.  Only a True answer tells the host anything (a ``HostSync`` record, as a synchronize).
        On hardware work is never done the instant it is issued, so the first query about work the host
        does not already know finished answers False: a query whose answer is ignored orders nothing,
        while a spin loop (``while not s.query()``) gets True on a later ask, once the work ran here.
        A spin loop on work that can never run would spin forever on hardware; after
        ``QUERY_SPIN_LIMIT`` asks with nothing else happening it becomes a host wait (``DeviceHang``)."""
        if event is not None:
            if not event.recorded:
                return True
            sid, mark, key = event.record_stream, event.record_mark, ("event", event.eid)
        else:
            sid, mark, key = stream.sid, self.stream_marks.get(stream.sid, -1), ("stream", stream.sid)
        if self.host_known.get(sid, -1) >= mark:
            return True
        ex = self.executor
        with self.lock:
            if not ex.done(sid, mark):
                ex.drain()                      # the device goes on while the host polls
            asked, spins, seen = self.queried.get(key, (None, 0, None))
            moment = (len(self.trace.log), ex.progress)
            if asked == mark and ex.done(sid, mark):
                del self.queried[key]
                done = True
            else:
                spins = spins + 1 if asked == mark and seen == moment else 0
                self.queried[key] = (mark, spins, moment)
                done = False
        if done or spins >= self.QUERY_SPIN_LIMIT:
            self.queried.pop(key, None)
            self.host_sync("event" if event is not None else "stream", device=self.trace.streams[sid].device,
                           stream=stream, event=event, site=site or user_site(3))
            return True
        return False

    def refuse_sync_in_capture(self, what: str, device: int = 0, stream: Optional[StreamState] = None,
                               event: Optional[EventState] = None, call: Optional[str] = None) -> None:
        """Raise the ACL error a real runtime gives when the host synchronises with work being captured
        into a graph: a capturing stream (``what`` "stream", or "read": a blocking device-to-host read,
        which synchronises the stream), any capturing stream of the device ("device"), or an event
        whose record was captured ("event").  A capture records tasks without running them, so the
        host can never see them done: aclrtSynchronizeStream/Device answer ACL_ERROR_RT_STREAM_CAPTURED
        (107027, "stream is captured") and aclrtSynchronizeEvent ACL_ERROR_RT_EVENT_CAPTURED (107028,
        "event is captured"), the codes of CANN's rt_error_codes.h; torch_npu raises them through
        NPU_CHECK_ERROR (" NPU function error: <call>, error code is <code>", the ACL suffix, then
        "[Error]: ...").  CUDA's analogue is "operation not permitted when stream is capturing".
        ``call``: the op a "read" is for, or the stream method (named in the message).  A blocking
        host-to-device copy's stream sync is not refused: compiled regions here copy lifted host
        constants to the device inside their aclgraph captures."""
        if what == "device":
            capturing = next((s for s in self.devices[device].streams.values() if s.capture is not None), None)
        elif what == "event":
            capture = None if event is None else getattr(event, "capture", None)
            if capture is None:
                return
            capturing = capture.stream
        else:
            capturing = stream if stream is not None and stream.capture is not None else None
        if capturing is None:
            return
        from .errors import ErrCode, pta_error

        capture = capturing.capture if what != "event" else event.capture
        api, code, text = {
            "device": ("aclrtSynchronizeDeviceWithTimeout", 107027, "stream is captured"),
            "event": ("aclrtSynchronizeEvent", 107028, "event is captured"),
        }.get(what, ("aclrtSynchronizeStreamWithTimeout", 107027, "stream is captured"))
        kind = {"device": "torch.npu.synchronize()", "stream": f"{capturing.label}.{call or 'synchronize'}()",
                "event": f"{event.label if event is not None else 'an event'}.synchronize()",
                "read": f"a blocking device-to-host read ({call or 'a value the host needs'})"}.get(what, what)
        where = f" at {first_user(sys._getframe(1))}"
        raise RuntimeError(
            f"NPU function error: {api}, error code is {code}{pta_error(ErrCode.ACL)}\n[Error]: {text}.\n"
            f"{kind}{where} synchronizes the host with {capturing.label}, which is capturing "
            f"{capture.graph.label}: a graph capture forbids host synchronisation (captured work is recorded, "
            f"not run, so the host can never see it done). Synchronize or read values before capture_begin() "
            f"or after capture_end() (read a graph's outputs after replay()).")

    def synced(self, what: str, device: int = 0, stream: Optional[StreamState] = None,
               event: Optional[EventState] = None):
        """``until()`` of a host sync: the device's streams, the stream, or the event's record ran."""
        ex = self.executor
        if what == "device":
            sids = [s.sid for s in self.devices[device].streams.values()]
            return lambda: all(ex.idle(sid) for sid in sids)
        if stream is not None:
            return lambda: ex.idle(stream.sid)
        if event is not None and event.recorded:
            sid, mark = event.record_stream, event.record_mark
            return lambda: ex.done(sid, mark)
        return lambda: True

    def host_wait(self, until, what: str = "the host") -> None:
        """Block this host thread until ``until()`` (device work ran): at once if it holds; inside
        ``run_ranks`` other ranks may release it; work that can never run raises ``DeviceHang``."""
        if until():
            return
        bound = self.thread().rank or self.extensions.get("collectives.process")   # (collectives/processes.py)
        if bound is None:
            self.executor.wait(until, None, what)
        else:
            job, rank = bound
            job.host_wait(rank, until, what)

    def _learn(self, sid: int, mark: int) -> None:
        if mark > self.host_known.get(sid, -1):
            self.host_known[sid] = mark

    def marker(self, kind: type, stream: Optional[StreamState] = None, site=None, **fields) -> None:
        """Append a marker record of type ``kind`` (a ``trace.Marker`` subclass) with ``fields``."""
        with self.lock:
            if stream is not None:
                fields["stream"] = stream.sid
            self._append(kind(seq=self._seq(), site=site or self.site_hint() or user_site(3), **fields))

    # ------------------------------------------------------------------ allocator
    def stream_mark(self, sid: int) -> int:
        return self.stream_marks.get(sid, -1)

    def stream_completed(self, sid: int, mark: int) -> bool:
        return self.host_known.get(sid, -1) >= mark

    def on_alloc(self, block, site=None, pool=None) -> None:
        if site is None:
            site = self.thread().site or user_site(3)
        bid, lo = block.bid, block.lo
        hi = lo + block.size
        trace = self.trace
        with self.lock:
            site_i = trace.object_ids.get(id(site))
            if site_i is None:
                site_i = trace.intern(site)
            trace.block_log[bid] = (bid, block.device, block.stream, lo, hi, block.requested, site_i, pool)
            ranges = self.freed_ranges.get(block.device)
            trace.log.append((ALLOC_ROW, bid, site_i, self._reused(ranges, lo, hi) if ranges else None))

    @staticmethod
    def _reused(ranges: list, lo: int, hi: int) -> Optional[int]:
        """The newest (most recently allocated) of the freed blocks (``ranges``: sorted ``(lo, hi, bid)``)
        whose bytes ``[lo, hi)`` occupies, if any; those freed ranges are used up."""
        # the ranges starting in [lo, hi) overlap it, and the one before ``lo`` may reach into it
        i = bisect.bisect_left(ranges, (lo,))
        if i and ranges[i - 1][1] > lo:
            i -= 1
        j = bisect.bisect_left(ranges, (hi,), i, min(i + 64, len(ranges)))
        if i == j:
            return None
        if j == i + 1:
            return ranges.pop(i)[2]
        hits = ranges[i:j]
        del ranges[i:j]
        return max(r[2] for r in hits)

    def known_block(self, block) -> None:
        """Name a block allocated by an earlier test's runtime (module-level tensors)."""
        if block.bid not in self.trace.block_log:
            self.trace.block_log[block.bid] = T.BlockInfo(block.bid, block.device, block.stream, block.lo,
                                                       block.lo + block.size, block.requested,
                                                       T.Site("<before this test>", 0))

    def on_free(self, block, frame=None) -> None:
        """``frame``: where the block's last reference went, if known (else the caller's caller)."""
        bid = block.bid
        trace = self.trace
        if bid not in trace.block_log:
            return  # allocated by an earlier test: not part of this trace
        site = self.thread().site or (user_site(3) if frame is None else first_user(frame))
        lo = block.lo
        freed = (lo, lo + block.size, bid)
        with self.lock:
            site_i = trace.object_ids.get(id(site))
            if site_i is None:
                site_i = trace.intern(site)
            trace.log.append((FREE_ROW, bid, site_i))
            ranges = self.freed_ranges.get(block.device)
            if ranges is None:
                self.freed_ranges[block.device] = [freed]
            else:
                bisect.insort(ranges, freed)

    def record_stream(self, block, stream: StreamState) -> None:
        with self.lock:
            block.stream_uses.add(stream.sid)
            self._append(T.RecordStream(self._seq(), block.bid, stream.sid, self.site_hint() or user_site(3)))


_current: Optional[Runtime] = None
_current_lock = threading.Lock()


def current() -> Runtime:
    """The running test's runtime (a fresh one after the plugin starts a new test)."""
    global _current
    rt = _current
    if rt is None or rt.generation != CONTEXT.generation:
        with _current_lock:
            rt = _current
            if rt is None or rt.generation != CONTEXT.generation:
                rt = _current = Runtime(CONTEXT.config, CONTEXT.generation)
    return rt


def peek() -> Optional[Runtime]:
    """The runtime of the running test if user code created one, else None."""
    rt = _current
    return rt if rt is not None and rt.generation == CONTEXT.generation else None
