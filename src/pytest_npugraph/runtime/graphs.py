"""Graph capture and replay on the emulated device (``torch.npu.NPUGraph`` and aclgraph).

Why this shape: a captured NPU graph is a fixed list of device tasks over fixed addresses.  While a
stream's ``capture`` is set, the work issued on it (and on side streams that joined the capture by
waiting on an event recorded in it) is *recorded, not executed*:

* each op becomes a replay step (the OpOverload and its CPU payload arguments, writing into the
  capture-time output payloads, which are the graph's static buffers) and a task template (stream,
  spans, cores, the core limits in force at capture, the user's line);
* event records/waits become task templates too;
* the trace gets *shadow* records at capture time (tasks without memory or cores, ``graph=`` the
  graph's ``GraphCall`` with ``replay=0``) between ``CaptureBegin`` and ``CaptureEnd``, so the
  event-misuse analysis can check that side streams were joined before the capture ended;
* the CPU computes during capture (outputs get shapes and values), but memory that existed before
  the capture and was written by it is restored at the end: a real capture executes nothing;
* likewise the capture device's generator (generators.py) is restored at the end: a capture draws
  no random numbers, and each replay draws from the generator's state at replay time and advances
  it, as the graph-safe philox state does (seed, capture, replay gives what the eager op gives);
  ``get_rng_state``/``set_rng_state`` of that device inside the capture are replay steps too
  (``rng_get``/``rng_set``), so a state read in the capture and set back later (activation
  checkpointing's ``preserve_rng_state``) makes every replay draw the same numbers twice.

``CapturedGraph.replay`` re-runs the steps on the CPU (``out=`` variants where they exist, else
compute and copy into the static buffer) and appends the task templates to the trace as ``Kernel``
records with ``graph=`` set, on the replay stream (for the capture stream) and the captured side
streams.  All analysis of the graph's structure happens once, at capture; a replay only appends.
"""
from __future__ import annotations

import contextvars
import weakref

import torch

from .. import trace as T
from . import generators, profiles

NO_CORES = T.OpCores(kind="AIV", cube=0, vector=0)   # a shadow task holds no cores


def _out_variant(func):
    """The ``out=`` overload computing exactly ``func`` (same arguments), and its out names."""
    found = _OUT.get(func, False)
    if found is not False:
        return found
    found = None
    schema = func._schema
    args = [(a.name, str(a.type)) for a in schema.arguments]
    packet = func.overloadpacket
    for name in packet.overloads():
        if not name.endswith("out") or name == func._overloadname:
            continue
        other = getattr(packet, name)._schema
        outs = [a.name for a in other.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        rest = [(a.name, str(a.type)) for a in other.arguments if a.name not in outs]
        if outs and rest == args and len(outs) == len(schema.returns):
            found = (getattr(packet, name), tuple(outs))
            break
    _OUT[func] = found
    return found


_OUT: dict = {}


def _tensors(value):
    """The output tensors of an op result (None where an output is not a tensor), or None."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return tuple(v if isinstance(v, torch.Tensor) else None for v in value)
    return None


def replay_step(func, args, kwargs, out):
    """``(fn, args, kwargs, dst)``: calling ``fn`` recomputes the op; ``dst`` (if any) is where the
    result must be copied (the static buffers); ``out=`` variants write there directly."""
    outs = _tensors(out)
    arg_ids = {id(a) for a in args if isinstance(a, torch.Tensor)} | {
        id(v) for v in kwargs.values() if isinstance(v, torch.Tensor)}
    if outs is None or all(o is None or id(o) in arg_ids for o in outs):
        return (func, args, kwargs, None)      # in place / out=: recomputing writes the buffers
    variant = _out_variant(func) if isinstance(func, torch._ops.OpOverload) else None
    if variant is not None and None not in outs and isinstance(out, torch.Tensor) == (len(variant[1]) == 1):
        fn, names = variant
        return (fn, args, dict(kwargs, **dict(zip(names, outs))), None)
    return (func, args, kwargs, outs)


# the device of the graph whose steps are being recomputed (its ops see CPU payloads; a host op such
# as save_npugraph_tensor names the device its tensors are on)
replaying_device: contextvars.ContextVar = contextvars.ContextVar("replaying_device", default=None)


class Capture:
    """Work being captured on ``stream`` into ``pool`` (see the module docstring)."""

    def __init__(self, rt, stream, pool, graph: T.GraphCall, site=None):
        self.rt = rt
        self.stream = stream
        self.pool = pool
        self.graph = graph                   # the graph's identity (replay 0: the capture)
        self.first_id = rt.new_block_id()   # blocks with a higher id were allocated by the capture
        self.streams = [stream]
        self.steps: list = []
        self.rng_slots: dict = {}            # slot -> the generator state a replay read there
        self.tasks: list = []
        self.saved: dict = {}                # storage address -> (storage, copy before the capture)
        self.events: list = []
        self.owner = None                    # the NPUGraph (or aclgraph) capturing
        self.updatable: tuple = ()           # op names whose arguments NPUGraph.update may patch
        self.updated: list = []              # indices of their replay steps
        self.generator = generators.default_generator(rt, stream.device)
        self.rng_state = self.generator.get_state()   # a capture draws no random numbers (see end)
        self.rng_reads: list = []            # (state read in the capture, its slot in a replay)
        stream.capture = self
        rt.marker(T.CaptureBegin, stream, graph=graph, pool=str(pool), site=site)

    # ------------------------------------------------------------ hooks (tensor/runtime)
    def preserve(self, written) -> None:
        """Save memory that existed before the capture before an op overwrites it."""
        for t in written:
            block = t._block
            if block is None or block.bid > self.first_id:
                continue
            storage = t._payload.untyped_storage()
            key = storage.data_ptr()
            if key not in self.saved:
                self.saved[key] = (storage, storage.clone())

    def add(self, op, reads, writes, stream, replay=None, site=None) -> None:
        rt = self.rt
        device = rt.devices[stream.device]
        cube, vector = device.explicit_limits(stream)
        site = site or T.UNKNOWN_SITE
        self.tasks.append(("k", stream, op, tuple(reads), tuple(writes), site,
                           profiles.resolve(op, device), cube, vector))
        if replay is not None:
            if self.updatable and op.split("::")[-1].split(".")[0] in self.updatable:
                self.updated.append(len(self.steps))
            self.steps.append(replay_step(*replay))
        rt.kernel_now(stream, op, (), (), NO_CORES, site, self.graph)

    def record(self, event, stream, site) -> None:
        self.tasks.append(("r", stream, event, site))
        event.capture = self
        self.events.append(event)
        self.rt._record_now(event, stream, site)

    def rng_get(self) -> torch.Tensor:
        """``get_rng_state`` of the capture device in the capture: the state now, and a replay step
        that reads the replay's state at this point (into the slot a later ``rng_set`` restores)."""
        state = self.generator.get_state()
        slot = len(self.rng_reads)
        self.rng_reads.append((state, slot))
        self.steps.append((_read_rng, (self.rng_slots, slot), {}, None))
        return state.clone()

    def rng_set(self, state: torch.Tensor) -> None:
        """``set_rng_state`` of the capture device in the capture: set now, and on each replay set to
        what the replay read where the capture read ``state`` (a state from outside: that state)."""
        self.generator.set_state(state)
        slot = next((i for known, i in self.rng_reads if torch.equal(known, state)), None)
        if slot is None:
            self.steps.append((_write_rng, (None, state.clone()), {}, None))
        else:
            self.steps.append((_write_rng, (self.rng_slots, slot), {}, None))

    def mark(self, kind: type, stream, **fields) -> None:
        """A marker that is part of the graph (a SuperKernel scope): recorded now and on each replay."""
        self.rt.marker(kind, stream, **fields)
        self.tasks.append(("m", stream, kind, fields, self.rt.trace.records[-1].site))

    def wait(self, event, stream, site) -> None:
        if stream.capture is None:          # waiting on a captured event joins the capture
            stream.capture = self
            self.streams.append(stream)
        self.tasks.append(("w", stream, event, site))
        self.rt._wait_now(event, stream, site)

    # ---------------------------------------------------------------------- end
    def end(self, site=None, aborted: bool = False) -> "CapturedGraph":
        """Finish the capture (``aborted``: an exception is leaving the capture block; its partial
        graph is not checked for joins)."""
        for storage, copy in self.saved.values():
            storage.copy_(copy)
        self.saved.clear()
        self.generator.set_state(self.rng_state)
        for s in self.streams:
            s.capture = None
        for e in self.events:
            e.capture = None
        self.rt.marker(T.CaptureAbort if aborted else T.CaptureEnd, self.stream, graph=self.graph, site=site)
        return CapturedGraph(self)


class CapturedGraph:
    """A finished capture: replayable steps and task templates."""

    def __init__(self, capture: Capture):
        self.graph = capture.graph
        self.pool = capture.pool
        self.origin = capture.stream
        self.steps = capture.steps
        self.tasks = capture.tasks
        self.streams = capture.streams
        self.runtime = weakref.ref(capture.rt)    # the test (runtime) whose streams and events it uses
        self.generator = capture.generator        # the capture device's: replays draw from it
        self.replays = 0

    def kernels(self) -> list:
        """``(stream label, op)`` of every captured kernel, in capture order."""
        return [(t[1].label, t[2]) for t in self.tasks if t[0] == "k"]

    def run(self) -> None:
        """Recompute every captured op on the CPU, in capture order (a valid order of the graph),
        drawing random numbers from the capture device's generator."""
        token = replaying_device.set(self.origin.device)
        try:
            with generators.drawing(self.generator):
                for fn, args, kwargs, dst in self.steps:
                    result = fn(*args, **kwargs)
                    if dst is not None:
                        for d, r in zip(dst, result if isinstance(result, (tuple, list)) else (result,)):
                            if d is not None and d is not r:
                                d.copy_(r)
        finally:
            replaying_device.reset(token)

    @property
    def label(self) -> str:
        return self.graph.label

    def emit(self, rt, stream, graph: T.GraphCall) -> None:
        """Append the captured tasks to the trace, the capture stream mapped to ``stream``."""
        append_tasks(rt, self.tasks, self.origin, stream, graph)

    def replay(self, rt, stream) -> None:
        """Recompute the graph's values (when the replay stream gets there: executor.py) and append
        its tasks to the trace."""
        self.replays += 1
        rt.executor.submit(stream.sid, len(rt.trace.log), self.run, what=f"replay of {self.graph.label}")
        self.emit(rt, stream, self.graph.replayed(self.replays))


def append_tasks(rt, tasks, origin, stream, graph=None, memory=None, caller=None) -> None:
    """Append task templates to the trace: ``("k", stream, op, reads, writes, site, cores, cube,
    vector)`` a kernel, ``("r"|"w", stream, event, site)`` an event record or wait, ``("m", stream,
    kind, fields, site)`` a marker; template stream ``origin`` is mapped to ``stream``.  A capture's
    replay (``graph``: the call its kernels belong to) and a planned run (``planned.Stretch``:
    ``memory`` moves the kernels' spans onto the run's blocks and serves ``("a", stream, base, nbytes,
    device, site)`` allocations and ``("f", None, base, site)`` frees; a site ``planned.CALLER`` is
    ``caller``) both come here."""
    from .planned import CALLER

    trace = rt.trace
    log, intern = trace.log, trace.intern
    marks = rt.stream_marks
    with rt.lock:
        graph_i = None if graph is None else intern(graph)
        caller_i = None if caller is None else intern(caller)
        for task in tasks:
            s = stream if task[1] is origin else task[1]
            kind = task[0]
            if kind == "k":
                site = task[5]
                reads, writes = task[3], task[4]
                if memory is not None:
                    reads, writes = memory.spans(reads), memory.spans(writes)
                seq = len(log)
                log.append((T.KERNEL_ROW, s.sid, task[2], reads, writes,
                            caller_i if site is CALLER else intern(site), intern(task[6]),
                            task[7], task[8], graph_i, None))
                marks[s.sid] = seq
                continue
            site = task[-1]
            if site is CALLER:
                site = caller
            if kind == "r":
                rt._record_now(task[2], s, site)
            elif kind == "w":
                rt._wait_now(task[2], s, site)
            elif kind == "m":
                rt.marker(task[2], s, site, **task[3])
            elif kind == "a":
                memory.malloc(s, task[2], task[3], task[4], site)
            elif kind == "h":
                rt.host_sync("stream", device=s.device, stream=s, site=site)
            else:
                memory.free(task[2], site)


def _read_rng(slots: dict, slot: int) -> None:
    """A replay step: the generator state here (``run`` draws through the CPU default generator)."""
    slots[slot] = torch.default_generator.get_state()


def _write_rng(slots, key) -> None:
    """A replay step: set the generator to the state slot ``key`` read (``slots`` None: to ``key``)."""
    torch.default_generator.set_state(key if slots is None else slots[key])


# -------------------------------------------------------------------- pools
def updatable_ops() -> tuple:
    """Names of the ops whose arguments a capture with ``auto_dispatch_capture=True`` records for
    ``NPUGraph.update`` (``OpSpec.graph_updatable``)."""
    from .ops import registry

    return registry.graph_updatable()


def _pool_ids(rt) -> dict:
    return rt.extensions.setdefault("graphs.pool_ids", {"handle": 0, "private": 0})


def pool_handle(rt) -> tuple:
    """A user pool id (``graph_pool_handle()``): ``(0, n)``, as torch's ``MempoolId_t``."""
    ids = _pool_ids(rt)
    ids["handle"] += 1
    return (0, ids["handle"])


def private_pool(rt) -> tuple:
    """The private pool id of a capture made without ``pool=``: ``(n, 0)``."""
    ids = _pool_ids(rt)
    ids["private"] += 1
    return (ids["private"], 0)


def reset_pool(rt, device: int, pool) -> list:
    """Give every live block of ``pool`` back to it (``_npu_setCheckpointPoolState`` to the pool's
    original, empty state): tensors still holding them become stale and keep their addresses, which
    later allocations in the pool reuse.  Returns the block ids made stale."""
    allocator = rt.devices[device].allocator
    stale = []
    for seg in list(allocator.segments):
        if seg.pool != pool:
            continue
        for chunk in list(seg.blocks):
            owner = chunk.owner
            if owner is not None and not owner.freed:
                stale.append(owner.bid)
                allocator.free(owner)
    return stale
