"""The recorded trace: everything the emulated runtime did, as plain data.

The runtime appends records in host program order; analyses read them and never
reach back into the runtime or the shims.  No torch import here: a trace can be
built by hand (tests, benchmarks, hypothesis strategies) as easily as by the emulator.

Identity conventions
--------------------
* ``stream``: a process-unique int (``StreamInfo.sid``), unique across devices.
* ``event``: a unique int per event object (``EventInfo.eid``).
* ``block``: a unique int per allocation (``BlockInfo.bid``); a reused address gets a new block.
* ``Span``: bytes of the simulated device address space of ``device``: ``[lo, hi)``, or the
  elements of a strided view within that range.  Two spans conflict when they are on the same
  device and share a byte, whatever block they belong to (that is how reuse after free shows up).
"""
from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from itertools import islice
from typing import ClassVar, NamedTuple, Optional, Union

from . import layout


def _record(cls):
    """``@dataclass(frozen=True)`` with its fields in slots, built fast: the emulator makes a few records
    per op, and a frozen dataclass stores each field through ``object.__setattr__`` (700 ns for a
    ``Kernel``; 280 ns here).  The slots belong to a hidden base class that is not frozen: ``__new__``
    fills an instance of the base with plain stores, then gives it the record's class (the same memory
    layout), whose ``__setattr__`` refuses every change."""
    names = list(cls.__dict__.get("__annotations__", {}))
    base = type(f"_{cls.__name__}Slots", cls.__bases__, {"__slots__": tuple(names), "__module__": cls.__module__})
    namespace = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    namespace["__slots__"] = ()
    record = dataclass(frozen=True)(type(cls.__name__, (base,), namespace))
    scope, params = {"_new": object.__new__, "_base": base}, []
    assert [f.name for f in fields(record)] == names, cls.__name__
    for f in fields(record):
        assert f.default_factory is MISSING and f.init and not f.kw_only, f"{cls.__name__}.{f.name}"
        if f.default is MISSING:
            params.append(f.name)
        else:
            scope[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
            delattr(record, f.name)      # the class attribute would hide the slot
    body = "".join(f"    self.{name} = {name}\n" for name in names)
    exec(f"def __new__(cls, {', '.join(params)}):\n    self = _new(_base)\n{body}    self.__class__ = cls\n"
         f"    return self\n", scope)
    scope["__new__"].__qualname__ = f"{cls.__qualname__}.__new__"
    record.__new__ = staticmethod(scope["__new__"])
    del record.__init__                  # object's: the fields are set
    record.__reduce__ = lambda self: (type(self), tuple(getattr(self, name) for name in names))
    record.__init_subclass__ = classmethod(_final)
    return record


def _final(cls, **kwargs):
    raise TypeError(f"{cls.__name__}: trace records cannot be subclassed (their instances are built on a "
                    f"fixed slot layout); make a new record type with @trace._record instead")


@_record
class Site:
    """A location in the user's source (never a plugin or torch frame)."""

    path: str
    line: int
    func: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


UNKNOWN_SITE = Site("<unknown>", 0)


@_record
class Span:
    """Bytes of ``device`` an access touches.  Dense: ``[lo, hi)``.  Strided (``dims`` non-empty,
    see ``layout``): runs of ``run`` bytes at ``lo + sum(i_d * stride_d)`` for ``(n_d, stride_d)``
    in ``dims``, ``0 <= i_d < n_d``; ``[lo, hi)`` is then their bounding range."""

    device: int
    lo: int
    hi: int
    block: int
    run: int = 0
    dims: tuple = ()

    @classmethod
    def of_view(cls, device: int, block: int, lo: int, item: int, shape, strides) -> "Span":
        """The span of a view of ``item``-byte elements starting at byte ``lo``."""
        return cls(*cls.row_of_view(device, block, lo, item, shape, strides))

    def row(self) -> tuple:
        """The span as the tuple of its fields, its row in the trace's log (``Span(*row)`` makes it back)."""
        if self.dims:
            return (self.device, self.lo, self.hi, self.block, self.run, self.dims)
        return (self.device, self.lo, self.hi, self.block)

    @staticmethod
    def row_of_view(device: int, block: int, lo: int, item: int, shape, strides) -> tuple:
        """``of_view``'s span as its row (``Span.row``)."""
        run, dims = layout.normalise(item, tuple(shape), tuple(strides))
        hi = lo + layout.extent(run, dims)
        return (device, lo, hi, block, run, dims) if dims else (device, lo, hi, block)

    def overlaps(self, other: "Span") -> bool:
        """Whether the two share a byte (exactly, for strided views too)."""
        if self.device != other.device or not (self.lo < other.hi and other.lo < self.hi):
            return False
        if not self.dims and not other.dims:
            return True
        return layout.intersects(self.lo, self.run or self.hi - self.lo, self.dims,
                                 other.lo, other.run or other.hi - other.lo, other.dims)


GRAPH_STREAM_BASE = 1 << 20   # stream ids of compiler-owned (GE) streams, outside torch_npu's encodings


@_record
class StreamInfo:
    sid: int
    device: int
    stream_id: int  # torch_npu encoding: 0 default, (3<<5)+i pool, ...
    label: str      # "npu:0/default", "npu:0/stream-3", "npu:0/decode_step:main", "npu:0/decode_step:tag '1' (stream-0)"
    site: Site = UNKNOWN_SITE   # the user's line that made it (an eager torch.npu.Stream()), if one did

    @property
    def name(self) -> str:
        """The label with the line that made the stream: ``npu:0/stream-1 (made at test_x.py:12)``
        (timelines and the HTML report; report texts say the label and list the lines once)."""
        return self.label if self.site == UNKNOWN_SITE else f"{self.label} (made at {self.site})"


@_record
class EventInfo:
    eid: int
    label: str            # "Event#3", "tagged event '66'", "ExternalEvent#2"
    site: Site            # where it was created
    external: bool = False
    tag: Optional[str] = None


@_record
class BlockInfo:
    bid: int
    device: int
    stream: int           # allocation stream (sid)
    lo: int
    hi: int
    size: int             # requested bytes
    site: Site
    pool: Optional[str] = None  # graph pool id, None for the normal allocator


@_record
class OpCores:
    """What an op asks of a device's cores when it runs (issue: cores/deadlock)."""

    kind: str = "AIV"          # AICore | AIV | AICPU | ATB | HCCL | MC2
    cube: int = 0              # blocks on cube (AI Core) cores; 0 = none
    vector: int = 0            # blocks on vector cores; 0 = none
    all_resident: bool = False  # every block must hold a core at once (NonZero, AIV collectives)
    limit_applies: bool = True  # whether core limits take effect (False for AICPU/ATB/static kernels)
    early_start: bool = False   # calls SetNextTaskStart: the next SuperKernel sub-kernel may start early


# ----------------------------------------------------------------------- records
@_record
class Kernel:
    """A device task on a stream: an op (eager or replayed), a copy, a collective."""

    seq: int
    stream: int
    op: str
    reads: tuple = ()          # tuple[Span, ...]
    writes: tuple = ()         # tuple[Span, ...]
    site: Site = UNKNOWN_SITE
    cores: OpCores = OpCores()
    cube_limit: int = 0        # effective limit on the issuing stream when issued (0 = none)
    vector_limit: int = 0
    graph: Optional["GraphCall"] = None  # the graph call it belongs to (replay, or capture shadow), None for eager
    collective: Optional[tuple] = None  # (group, sequence number) for a collective, matched across ranks


@_record
class EventRecord:
    seq: int
    stream: int
    event: int
    site: Site = UNKNOWN_SITE


@_record
class EventWait:
    """The stream waits for the event's latest record (a no-op if never recorded)."""

    seq: int
    stream: int
    event: int
    site: Site = UNKNOWN_SITE


@_record
class HostSync:
    """The host blocks until work completes.

    ``what`` is ``"device"`` (all streams of ``device``), ``"stream"`` (``stream``),
    ``"event"`` (the latest record of ``event``) or ``"read"`` (a blocking host read such
    as ``.item()``/``.cpu()``, which waits for ``stream``).
    """

    seq: int
    what: str
    device: int = 0
    stream: Optional[int] = None
    event: Optional[int] = None
    site: Site = UNKNOWN_SITE


@_record
class Alloc:
    seq: int
    block: int
    site: Site = UNKNOWN_SITE
    reuses: Optional[int] = None  # the freed block whose address range this one reuses


@_record
class Free:
    """The last reference to a block died (the caching allocator takes it back)."""

    seq: int
    block: int
    site: Site = UNKNOWN_SITE


@_record
class RecordStream:
    seq: int
    block: int
    stream: int
    site: Site = UNKNOWN_SITE


class Marker:
    """Base of the host-side annotations below (one record type per fact).

    Every marker has ``seq``, ``stream`` (a sid or None) and ``site``; ``what`` names the kind
    for reports and timelines.  Analyses match on the record type, never on ``what``.
    """

    __slots__ = ()
    what: ClassVar[str] = "marker"

    def facts(self) -> dict:
        """The kind's own fields (not seq, stream, site), for timelines and reports."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("seq", "stream", "site")}


def _marker(what: str):
    """Declare a frozen marker record of kind ``what`` (fields: seq, the kind's own, stream, site)."""
    def make(cls):
        cls.what = what
        return _record(cls)
    return make


@_marker("device")
class DeviceCores(Marker):
    """Once per device at start: its physical AI Core (cube) and Vector Core counts."""

    seq: int
    device: int
    cube: int
    vector: int
    stream: Optional[int] = None
    site: Site = UNKNOWN_SITE


@_marker("group")
class GroupCreated(Marker):
    """A communicator was created: the devices taking part in collective group ``group``."""

    seq: int
    group: str
    devices: tuple
    stream: Optional[int] = None
    site: Site = UNKNOWN_SITE


@_marker("stream_limit")
class StreamLimit(Marker):
    """``set_stream_limit``/``reset_stream_limit``: the limits now in force on ``stream`` (-1 = none)."""

    seq: int
    stream: int
    cube: int
    vector: int
    site: Site = UNKNOWN_SITE


@_marker("device_limit")
class DeviceLimit(Marker):
    """``set_device_limit``: the limits now in force on ``device`` (-1 = none)."""

    seq: int
    device: int
    cube: int
    vector: int
    stream: Optional[int] = None
    site: Site = UNKNOWN_SITE


@_marker("event_reset")
class EventReset(Marker):
    """An external event was reset: its next wait belongs to its next record."""

    seq: int
    event: int
    stream: Optional[int] = None
    site: Site = UNKNOWN_SITE


@_marker("host_access")
class HostAccess(Marker):
    """The host used CPU memory that a non_blocking copy task ``copy`` (a ``Kernel`` seq) uses:
    ``role`` ``"destination"`` (a device-to-host copy writes it) or ``"source"`` (a host-to-device copy
    reads it).  ``access`` is ``"read"`` or ``"write"``, ``op`` the torch call that used it.  Recorded
    only while the host did not know the copy done (host_races.py decides with happens-before)."""

    seq: int
    copy: int
    access: str
    op: str
    role: str = "destination"
    stream: Optional[int] = None
    site: Site = UNKNOWN_SITE


_KEY_HASH = re.compile(r"(?<=\])-?\d+$")     # the parameter-address hash TorchAir appends to a key


def shown_key(key: Optional[str]) -> str:
    """The part of a reduce-overhead graph key worth showing: ``[[4]]`` of ``[[4]]-8812...``; "" for
    ``no_updated_input<hash>`` (no input picks the key) and for None (an NPUGraph has no key)."""
    if not key or key.startswith("no_updated_input"):
        return ""
    return _KEY_HASH.sub("", key)


@_record
class GraphCall:
    """Which captured graph a task belongs to: ``decode_step[[4]]#replay3`` as a structure.

    ``name`` is the graph's name in reports (``runtime/graph_names.py``: the user's function, or
    ``NPUGraph@test_x.py:12`` for a capture), ``key`` the aclgraph graph key (one capture per key;
    None for ``torch.npu.NPUGraph``), ``replay`` the n-th replay (1, 2, ...) or 0 for the capture
    itself (the shadow tasks recorded while capturing).
    """

    name: str
    key: Optional[str] = None
    replay: int = 0

    @property
    def label(self) -> str:
        """The graph (not the call): ``decode_step``, ``decode_step[[4]]`` (the key, where an input
        shape picks it) or ``NPUGraph@test_x.py:12``.  TorchAir's ``no_updated_input`` and the
        parameter-address hash it appends to a key say nothing to the user and are left out."""
        shown = shown_key(self.key)
        return f"{self.name}[{shown}]" if shown else self.name

    @property
    def capture(self) -> bool:
        return self.replay == 0

    def replayed(self, n: int) -> "GraphCall":
        return GraphCall(self.name, self.key, n)

    def __str__(self) -> str:
        return f"{self.label}#" + ("capture" if self.replay == 0 else f"replay{self.replay}")


@_marker("capture_begin")
class CaptureBegin(Marker):
    seq: int
    stream: int
    graph: GraphCall
    pool: str
    site: Site = UNKNOWN_SITE


@_marker("capture_end")
class CaptureEnd(Marker):
    seq: int
    stream: int
    graph: GraphCall
    site: Site = UNKNOWN_SITE


@_marker("capture_abort")
class CaptureAbort(Marker):
    """An exception left the capture block: its partial graph is dropped."""

    seq: int
    stream: int
    graph: GraphCall
    site: Site = UNKNOWN_SITE


@_marker("super_kernel_begin")
class SuperKernelBegin(Marker):
    seq: int
    stream: int
    name: str
    options: str = ""
    site: Site = UNKNOWN_SITE


@_marker("super_kernel_end")
class SuperKernelEnd(Marker):
    seq: int
    stream: int
    name: Optional[str]
    options: str = ""
    site: Site = UNKNOWN_SITE


@_marker("super_kernel_optimize")
class SuperKernelOptimize(Marker):
    seq: int
    optimize: str
    debug: str
    stream: Optional[int] = None
    site: Site = UNKNOWN_SITE


@_marker("task_group_begin")
class TaskGroupBegin(Marker):
    seq: int
    stream: int
    site: Site = UNKNOWN_SITE


@_marker("task_group_end")
class TaskGroupEnd(Marker):
    seq: int
    stream: int
    site: Site = UNKNOWN_SITE


@_marker("task_update_begin")
class TaskUpdateBegin(Marker):
    seq: int
    stream: int
    task_group: object = None
    site: Site = UNKNOWN_SITE


@_marker("task_update_end")
class TaskUpdateEnd(Marker):
    seq: int
    stream: int
    site: Site = UNKNOWN_SITE


@_marker("graph_outputs")
class GraphOutputs(Marker):
    """A graph call returned handles onto its static outputs (``spans``)."""

    seq: int
    stream: int
    call: GraphCall
    spans: tuple
    site: Site = UNKNOWN_SITE


@_marker("graph_output_read")
class GraphOutputRead(Marker):
    """A task is about to use a handle onto ``call``'s output (just before that task)."""

    seq: int
    stream: int
    call: GraphCall
    span: Span
    site: Site = UNKNOWN_SITE


class ReinplaceVerdict(NamedTuple):
    """``Reinplace.verdict``: what TorchAir's reinplace passes decided for one graph node."""

    graph: str                  # the graph's report name ("decode_step", runtime/graph_names.py)
    node: str
    op: str                     # the functional op ("aten::add.Tensor", as Kernel.op)
    inplace_op: str             # what it becomes when applied ("aten::add_.Tensor")
    verdict: str                # "applied", "disabled" (its debug.aclgraph switch) or "vetoed" (multi-stream)
    pass_name: str              # "inplaceable" or "input-mutated"
    switch: str                 # its ``debug.aclgraph`` switch
    streams: tuple              # distinct stream labels of the mutated tensor's users
    users: tuple                # (user node name, its stream label, its Site or None) per user


@_marker("reinplace")
class Reinplace(Marker):
    """What TorchAir's reinplace passes decided for one graph node."""

    seq: int
    verdict: ReinplaceVerdict
    stream: Optional[int] = None
    site: Site = UNKNOWN_SITE


Record = Union[Kernel, EventRecord, EventWait, HostSync, Alloc, Free, RecordStream, Marker]


# Compact rows: the emulator's three most frequent records (a task, an allocation, a free) are logged as
# plain tuples of numbers and strings, made records only when something reads ``Trace.records``.  A
# tuple of atoms is cheap to build (a ``Kernel`` record costs six times more) and the garbage collector
# stops tracking it after its first collections, while each record object stays tracked for the test's
# life: walking them cost 6-14 us per op of a 200,000-op test (bench/bench_long_loop.py).  Non-atomic field values (sites,
# op core profiles, graph calls) are interned in ``Trace.objects`` and rows hold their index; spans are
# ``Span`` field tuples (``Span.row``).
KERNEL_ROW, ALLOC_ROW, FREE_ROW = 0, 1, 2
# (KERNEL_ROW, stream, op, reads, writes, site, cores, cube_limit, vector_limit, graph or None, collective)
# (ALLOC_ROW, block, site, reuses)          (FREE_ROW, block, site)
# block rows (``Trace.blocks`` values): (bid, device, stream, lo, hi, size, site, pool)


class Trace:
    """Append-only log of records plus the tables that name things in reports.

    ``records`` (the log as record objects) and ``blocks`` (bid -> ``BlockInfo``) are what analyses
    read; the runtime appends compact rows to ``log`` and ``block_log`` instead (see ``KERNEL_ROW``),
    which those two make records of, in place, when read."""

    def __init__(self, records=None, streams=None, events=None, blocks=None):
        self.log: list = [] if records is None else records   # records, and rows not made records yet
        self.streams: dict = {} if streams is None else streams   # sid -> StreamInfo
        self.events: dict = {} if events is None else events      # eid -> EventInfo
        self.block_log: dict = {} if blocks is None else blocks   # bid -> BlockInfo, or its row
        self.objects: list = []          # interned field values of rows, by index
        self.object_ids: dict = {}       # id(value) -> its index in ``objects`` (which keeps it alive)
        self._made = 0                   # log[:_made] holds no row
        self._blocks_made = 0            # len(block_log) when its rows were last made records
        self._spans: dict = {}           # span row -> its Span: one object per distinct span

    def __len__(self) -> int:
        return len(self.log)

    @property
    def next_seq(self) -> int:
        return len(self.log)

    def append(self, record) -> None:
        self.log.append(record)

    def intern(self, value) -> int:
        """The index of ``value`` in ``objects`` (a row's reference to a site, a profile, a graph call).
        The runtime's per-op paths inline the ``object_ids`` lookup and call this for a new value only."""
        i = self.object_ids.get(id(value))
        if i is None:
            i = self.object_ids[id(value)] = len(self.objects)
            self.objects.append(value)
        return i

    def with_records(self, records: list) -> "Trace":
        """This trace's tables with another list of records (a prefix, a reordering)."""
        trace = Trace(records, self.streams, self.events, self.block_log)
        trace.objects, trace.object_ids = self.objects, self.object_ids    # the rows' interned values
        return trace

    @property
    def records(self) -> list:
        log = self.log
        if self._made < len(log):
            self._make_records(log)
        return log

    @records.setter
    def records(self, records: list) -> None:
        self.log, self._made = records, 0

    @property
    def blocks(self) -> dict:
        table = self.block_log
        new = len(table) - self._blocks_made
        if new:     # blocks are added, never removed: the new ones are the last (a copy, in one C call)
            objects = self.objects
            for bid, row in list(islice(reversed(table.items()), new) if new > 0 else table.items()):
                if type(row) is tuple:
                    table[bid] = BlockInfo(*row[:6], objects[row[6]], row[7])
            self._blocks_made = len(table)
        return table

    def _make_records(self, log: list) -> None:
        objects, spans = self.objects, self._spans

        def spans_of(rows):
            out = []
            for row in rows:
                s = spans.get(row)
                if s is None:
                    s = spans[row] = Span(*row)
                out.append(s)
            return tuple(out)
        end = len(log)          # rows appended meanwhile (another rank's thread) wait for the next read
        for i in range(self._made, end):
            row = log[i]
            if type(row) is not tuple:
                continue
            kind = row[0]
            if kind == KERNEL_ROW:
                _, stream, op, reads, writes, site, cores, cube, vector, graph, collective = row
                log[i] = Kernel(i, stream, op, spans_of(reads), spans_of(writes), objects[site], objects[cores],
                                cube, vector, None if graph is None else objects[graph], collective)
            elif kind == ALLOC_ROW:
                log[i] = Alloc(i, row[1], objects[row[2]], row[3])
            else:
                log[i] = Free(i, row[1], objects[row[2]])
        self._made = end
