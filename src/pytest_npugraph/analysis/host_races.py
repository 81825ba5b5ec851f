"""Host/device races (kind ``race``, the host as one party): the host uses CPU memory that a
pending ``non_blocking`` copy task writes (a device-to-host destination) or writes CPU memory that
one reads (a host-to-device source).

Why: ``z = y.to("cpu", non_blocking=True); z.sum().item()`` returns at once on the device; the
host reads ``z`` while the copy may still be running and sees old memory (a vLLM-Ascend bug, fixed
by a sync).  Refilling a staging buffer that a non_blocking upload still reads is the same bug the
other way: the device gets the new values.  The runtime records each such torch call while the host
did not know the copy done (``HostAccess``); here the happens-before model decides whether some host
sync (``synchronize``, ``event.synchronize``, a blocking read of the stream) ordered the copy before
the access.  One report per (copy line, access line).
"""
from __future__ import annotations

from ..hazard import Hazard
from ..trace import HostAccess
from . import describe, happens_before

KIND = "race"


def find(trace, cache: dict | None = None) -> list:
    accesses = [r for r in trace.records if type(r) is HostAccess]
    if not accesses:
        return []
    hb = happens_before.of(trace, cache)
    found: dict = {}
    for acc in accesses:
        if hb.ordered(acc.copy, acc.seq):
            continue
        copy = trace.records[hb.position(acc.copy)]
        key = (describe.site(copy), describe.site(acc), acc.access)
        if key not in found:
            found[key] = _hazard(trace, copy, acc)
    return list(found.values())


def _hazard(trace, copy, acc) -> Hazard:
    stream = describe.stream(trace, copy.stream)
    verb = "reads" if acc.access == "read" else "writes"
    if acc.role == "source":
        what = "CPU source of the non_blocking host-to-device"
        effect = "the copy can take the new values instead of those the host meant to send"
    else:
        what = "CPU destination of the non_blocking device-to-host"
        effect = ("it can see the memory as it was before the copy" if acc.access == "read"
                  else "the copy can overwrite what the host wrote")
    message = (f"host/device race: the host {verb} the {what} "
               f"copy {copy.op} issued at {describe.site(copy)} on {stream} ({acc.op} at {describe.site(acc)}) "
               f"before it knows the copy done, so {effect}. Fix: call "
               f"{describe.stream_expr(trace, copy.stream)}.synchronize() (or event.synchronize() on an event "
               f"recorded after the copy) before {describe.site(acc)}, or copy with non_blocking=False.")
    where = [describe.site(r) for r in (copy, acc) if describe.known(r)]
    return Hazard(KIND, message, where, [stream, "host"], [copy.op, acc.op], (copy.seq, acc.seq))
