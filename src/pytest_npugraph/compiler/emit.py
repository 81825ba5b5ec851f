"""Every trace record the compiler layer writes itself, in one place (the device work of a compiled
graph is recorded by the runtime as it runs): reinplace verdicts, the outputs a replay handed out,
GE's SuperKernel scopes, and the input copy-in task of a replay."""
from __future__ import annotations

from ..runtime import profiles
from ..runtime.runtime import current
from . import fxgraph


def reinplace_verdicts(verdicts) -> None:
    """One ``reinplace`` marker per ``(node, ReinplaceVerdict)`` in the running test's trace."""
    rt = current()
    for node, verdict in verdicts:
        rt.marker("reinplace", detail=verdict, site=fxgraph.node_site(node))


def graph_outputs(rt, stream, graph: str, key: str, call: int, spans: tuple, site) -> None:
    """The outputs a replay handed out (read by the ``output-overwrite`` analysis)."""
    rt.marker("graph_outputs", stream, detail=(graph, key, call, spans), site=site)


def super_kernel_begin(rt, stream, scope) -> None:
    rt.marker("super_kernel_begin", stream, detail=scope)


def super_kernel_end(rt, stream, scope) -> None:
    rt.marker("super_kernel_end", stream, detail=scope)


def copy_inputs(rt, stream, reads: list, writes: list, site) -> None:
    """The copy of a call's inputs into the buffers a captured graph reads (one task)."""
    op = "aten::_foreach_copy_" if len(writes) > 1 else "aten::copy_"
    rt.kernel(stream, op, reads, writes, cores=profiles.COPY, site=site)
