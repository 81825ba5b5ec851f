"""The builder of hand-written traces for the analysis tests (memory, ordering, cores, deadlocks).

Streams, events and tensors are named by strings (streams and events also by the ids ``stream()``
and ``event()`` return); every call appends one record (or two, for ``wait_stream``) with its own
source line ``model.py:<seq + 1>`` and returns its seq.

    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("main", writes="x")
    b.kernel("side", reads=b.view("x", 0, 32))

For the core and deadlock analyses, ``Build(devices=N, cube=..., vector=...)`` starts with each
device's ``DeviceCores`` and no streams; ``kernel`` takes the op's core profile (``cube``,
``vector``, ``resident``, ``kind``, ``limit_applies``) and records the stream's limits in force
(``limit``); ``collective`` issues a member of a collective.
"""
from __future__ import annotations

from pytest_npugraph import trace as T

PATH = "model.py"


class Build:
    def __init__(self, *streams: str, device: int = 0, devices=None, cube: int = 24, vector: int = 48) -> None:
        self.trace = T.Trace()
        self.sids: dict = {}
        self.eids: dict = {}
        self.bids: dict = {}
        self.limits: dict = {}  # sid -> [cube, vector] limit in force (0 = none)
        self._top: dict = {}  # device -> next free address
        if devices is not None:                 # the cores style: device pools, streams made later
            for d in range(devices):
                self.marker(T.DeviceCores, device=d, cube=cube, vector=vector)
            return
        for name in streams or ("main", "side"):
            self.stream(name, device)

    # ---------------------------------------------------------------- tables
    def stream(self, name: str = "", device: int = 0) -> int:
        """A stream labelled ``npu:<device>/<name>``; its name refers to it (the first of that name)."""
        n = len(self.trace.streams)
        sid = n + 100
        name = name or f"stream-{n}"
        self.sids.setdefault(name, sid)
        self.limits[sid] = [0, 0]
        self.trace.streams[sid] = T.StreamInfo(sid, device, n, f"npu:{device}/{name}")
        return sid

    def _sid(self, stream) -> int:
        return stream if isinstance(stream, int) else self.sids[stream]

    def event(self, name=None, *, external: bool = False, tag=None) -> int:
        if isinstance(name, int):
            return name
        if name is None:
            name = f"_event{len(self.eids)}"
        if name not in self.eids:
            eid = self.eids[name] = len(self.eids) + 500
            label = f"tagged event {tag!r}" if tag is not None else f"Event#{eid}"
            self.trace.events[eid] = T.EventInfo(eid, label, T.Site(PATH, 1), external, tag)
        return self.eids[name]

    def site(self, line=None) -> T.Site:
        return T.Site(PATH, self.trace.next_seq + 1 if line is None else line)

    def _add(self, cls, *args, line=None, **kw) -> int:
        seq = self.trace.next_seq
        self.trace.append(cls(seq, *args, site=self.site(line), **kw))
        return seq

    # ---------------------------------------------------------------- memory
    def alloc(self, name: str, size: int = 64, stream=None, *, reuses=None, at=None,
              device: int = 0, line=None) -> int:
        """A new block on ``stream`` (default: the first stream, or the stream of the block it
        ``reuses``, the caching allocator's rule); ``reuses`` names a freed block whose address
        it takes (same start)."""
        old = self.trace.blocks[self.bids[reuses]] if reuses is not None else None
        lo = old.lo if old is not None else at
        if stream is not None:
            sid = self._sid(stream)
        else:
            sid = old.stream if old is not None else next(iter(self.sids.values()))
        if lo is None:
            lo = self._top.get(device, 0)
            self._top[device] = lo + size
        bid = self.bids[name] = len(self.bids) + 1000
        site = self.site(line)
        self.trace.blocks[bid] = T.BlockInfo(bid, device, sid, lo, lo + size, size, site)
        self._add(T.Alloc, bid, line=line, reuses=old.bid if old is not None else None)
        return bid

    def view(self, name: str, lo: int = 0, hi=None) -> T.Span:
        """Bytes ``[lo, hi)`` of a tensor, offsets relative to its start."""
        info = self.trace.blocks[self.bids[name]]
        return T.Span(info.device, info.lo + lo, info.lo + (info.size if hi is None else hi), info.bid)

    def strided(self, name: str, offset: int, shape, strides, item: int = 1) -> T.Span:
        """The elements of a strided view of a tensor (``offset`` and ``strides`` in elements of
        ``item`` bytes, relative to its start)."""
        info = self.trace.blocks[self.bids[name]]
        return T.Span.of_view(info.device, info.bid, info.lo + offset * item, item, shape, strides)

    def _spans(self, items) -> tuple:
        if isinstance(items, (str, T.Span)):
            items = (items,)
        return tuple(self.view(i) if isinstance(i, str) else i for i in items)

    def free(self, name: str, line=None) -> int:
        return self._add(T.Free, self.bids[name], line=line)

    def record_stream(self, name: str, stream: str, line=None) -> int:
        return self._add(T.RecordStream, self.bids[name], self._sid(stream), line=line)

    # ---------------------------------------------------------------- device work
    def kernel(self, stream, reads=(), writes=(), op: str = "aten::op", line=None, *, cube: int = 0,
               vector: int = 0, resident: bool = False, kind: str = "AIV", limit_applies: bool = True,
               cores=None, **kw) -> int:
        """A task of ``op`` on ``stream`` asking for ``cube``/``vector`` cores (or ``cores``, an
        ``OpCores``); the stream's limits in force are recorded."""
        sid = self._sid(stream)
        cube_limit, vector_limit = self.limits.get(sid, (0, 0))
        if cores is None:
            cores = T.OpCores(kind, cube, vector, resident, limit_applies)
        kw.setdefault("cube_limit", cube_limit)
        kw.setdefault("vector_limit", vector_limit)
        return self._add(T.Kernel, sid, op, self._spans(reads), self._spans(writes), line=line, cores=cores, **kw)

    def collective(self, stream, op: str, group: str, seq: int, **cores) -> int:
        """Member ``seq`` of collective group ``group``: resident by default (an AIV-mode collective
        holds its cores while it waits for its peers)."""
        cores.setdefault("resident", True)
        return self.kernel(stream, op=op, kind=cores.pop("kind", "HCCL"), collective=(group, seq), **cores)

    def limit(self, stream, cube: int = -1, vector: int = -1) -> int:
        """``torch.npu.set_stream_limit(stream, cube, vector)``: -1 leaves a value unchanged."""
        sid = self._sid(stream)
        for i, value in enumerate((cube, vector)):
            if value != -1:
                self.limits[sid][i] = value
        return self.marker(T.StreamLimit, stream=sid, cube=cube, vector=vector)

    def record(self, event, stream, line=None) -> int:
        return self._add(T.EventRecord, self._sid(stream), self.event(event), line=line)

    def wait(self, event, stream, line=None) -> int:
        return self._add(T.EventWait, self._sid(stream), self.event(event), line=line)

    def wait_stream(self, waiter, waitee) -> int:
        """``waiter.wait_stream(waitee)``: record a fresh event on ``waitee``, wait on ``waiter``."""
        event = f"_wait_stream{self.trace.next_seq}"
        self.record(event, waitee)
        return self.wait(event, waiter)

    # ---------------------------------------------------------------- host
    def sync(self, what: str = "device", stream=None, event=None, device: int = 0, line=None) -> int:
        return self._add(T.HostSync, what, device, self._sid(stream) if stream is not None else None,
                         self.event(event) if event is not None else None, line=line)

    def marker(self, kind: type, stream=None, line=None, **fields) -> int:
        """A marker record of type ``kind``; a capture marker gets a graph (and pool) by default."""
        if kind in (T.CaptureBegin, T.CaptureEnd, T.CaptureAbort):
            fields.setdefault("graph", T.GraphCall("NPUGraph#1"))
        if kind is T.CaptureBegin:
            fields.setdefault("pool", "(1, 0)")
        if stream is not None:
            fields["stream"] = self._sid(stream)
        seq = self.trace.next_seq
        self.trace.append(kind(seq=seq, site=self.site(line), **fields))
        return seq


def dump(trace: T.Trace) -> str:
    """One line per record with stream labels and block names by id, for failure notes."""
    label = {sid: info.label.split("/", 1)[-1] for sid, info in trace.streams.items()}
    lines = []
    for r in trace.records:
        fields = []
        for name in ("stream", "op", "event", "block", "reuses", "what", "reads", "writes"):
            value = getattr(r, name, None)
            if value in (None, ()):
                continue
            if name == "stream":
                value = label.get(value, value)
            elif name in ("reads", "writes"):
                value = [f"b{sp.block}[{sp.lo},{sp.hi})" + (f"run{sp.run}x{sp.dims}" if sp.dims else "")
                         for sp in value]
            fields.append(f"{name}={value}")
        lines.append(f"{r.seq:3} {type(r).__name__} " + " ".join(fields) + f" @{r.site.line}")
    return "\n".join(lines)
