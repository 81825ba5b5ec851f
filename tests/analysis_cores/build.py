"""Hand-written traces for the core and deadlock analyses: what the runtime would record.

Why: the analyses read plain trace records, so tests state scenarios directly (devices,
streams, ops with their core profiles, limits, events, collectives) without torch.
"""
from __future__ import annotations

from pytest_npugraph.trace import (DeviceCores, EventInfo, EventRecord, EventWait, HostSync, Kernel, Marker,
                                   OpCores, Site, StreamInfo, StreamLimit, Trace)


class Builder:
    """Appends records in host order; every record gets its own ``model.py`` line."""

    def __init__(self, devices: int = 1, cube: int = 24, vector: int = 48) -> None:
        self.trace = Trace()
        self.limits: dict = {}     # sid -> [cube, vector] in force (0 = none)
        for device in range(devices):
            self.marker(DeviceCores, device=device, cube=cube, vector=vector)

    def site(self, line=None) -> Site:
        return Site("model.py", self.trace.next_seq + 1 if line is None else line)

    def marker(self, kind: type, **fields) -> Marker:
        rec = kind(seq=self.trace.next_seq, site=self.site(), **fields)
        self.trace.append(rec)
        return rec

    def stream(self, device: int = 0, name: str = "") -> int:
        sid = len(self.trace.streams)
        label = f"npu:{device}/{name or f'stream-{sid}'}"
        self.trace.streams[sid] = StreamInfo(sid, device, sid, label)
        self.limits[sid] = [0, 0]
        return sid

    def limit(self, sid: int, cube: int = -1, vector: int = -1) -> Marker:
        """``torch.npu.set_stream_limit(stream, cube, vector)``: -1 leaves a value unchanged."""
        for i, value in enumerate((cube, vector)):
            if value != -1:
                self.limits[sid][i] = value
        return self.marker(StreamLimit, stream=sid, cube=cube, vector=vector)

    def kernel(self, sid: int, op: str, *, vector: int = 0, cube: int = 0, resident: bool = False,
               kind: str = "AIV", limit_applies: bool = True, collective=None, line=None) -> Kernel:
        """``line``: the call site's line, for ops issued by one line in a loop."""
        cube_limit, vector_limit = self.limits[sid]
        rec = Kernel(self.trace.next_seq, sid, op, site=self.site(line),
                     cores=OpCores(kind, cube, vector, resident, limit_applies),
                     cube_limit=cube_limit, vector_limit=vector_limit, collective=collective)
        self.trace.append(rec)
        return rec

    def collective(self, sid: int, op: str, group: str, seq: int, **cores) -> Kernel:
        """An AIV-mode collective: resident by default (it holds its cores while it waits)."""
        cores.setdefault("resident", True)
        return self.kernel(sid, op, kind=cores.pop("kind", "HCCL"), collective=(group, seq), **cores)

    def event(self) -> int:
        eid = len(self.trace.events)
        self.trace.events[eid] = EventInfo(eid, f"Event#{eid}", self.site())
        return eid

    def record(self, sid: int, eid: int) -> EventRecord:
        rec = EventRecord(self.trace.next_seq, sid, eid, self.site())
        self.trace.append(rec)
        return rec

    def wait(self, sid: int, eid: int) -> EventWait:
        rec = EventWait(self.trace.next_seq, sid, eid, self.site())
        self.trace.append(rec)
        return rec

    def order(self, first: int, then: int) -> int:
        """``then.wait_stream(first)``: a fresh event recorded on ``first``, waited on ``then``."""
        eid = self.event()
        self.record(first, eid)
        self.wait(then, eid)
        return eid

    def sync(self, device: int = 0) -> HostSync:
        rec = HostSync(self.trace.next_seq, "device", device, site=self.site())
        self.trace.append(rec)
        return rec


def seed(nonzero_limit: int = 0) -> Builder:
    """Seed 000: two cards with 48 vector cores; reduce-scatter (16) and dispatch/combine
    (24) on their own streams, NonZero (all 48 at once) on a third, all concurrent.
    ``nonzero_limit`` limits NonZero's stream (the seed's fix is 8 = 48 - 16 - 24)."""
    b = Builder(devices=2)
    for device in range(2):
        rs, ep, nz = (b.stream(device, name) for name in ("hccl", "moe", "compute"))
        b.collective(rs, "reduce_scatter", "tp", 0, vector=16)
        b.collective(ep, "dispatch_combine", "ep", 0, vector=24, kind="MC2")
        if nonzero_limit:
            b.limit(nz, vector=nonzero_limit)
        b.kernel(nz, "nonzero", vector=48, resident=True)
    return b
