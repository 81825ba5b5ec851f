"""Every trace record the compiler layer writes itself, in one place (the device work of a compiled
graph is recorded by the runtime as it runs): reinplace verdicts, the outputs a replay handed out,
GE's SuperKernel scopes, and the input copy-in task of a replay."""
from __future__ import annotations

from .. import trace as T
from ..runtime import profiles
from ..runtime.runtime import current
from . import fxgraph


def reinplace_verdicts(verdicts) -> None:
    """One ``Reinplace`` marker per ``(node, ReinplaceVerdict)`` in the running test's trace."""
    rt = current()
    for node, verdict in verdicts:
        rt.marker(T.Reinplace, verdict=verdict, site=fxgraph.node_site(node))


def graph_outputs(rt, stream, graph: str, key: str, call: int, spans: tuple, site) -> None:
    """The outputs a replay handed out (read by the ``output-overwrite`` analysis)."""
    rt.marker(T.GraphOutputs, stream, call=T.GraphCall(graph, key, call), spans=spans, site=site)


def super_kernel_begin(rt, stream, scope, site=None) -> None:
    """``site``: the line of the scope's ``with`` (None: the line running when the scope opened)."""
    rt.marker(T.SuperKernelBegin, stream, site=site, name=scope[0], options=scope[1])


def super_kernel_end(rt, stream, scope) -> None:
    rt.marker(T.SuperKernelEnd, stream, name=scope[0], options=scope[1])


def copy_inputs(rt, stream, reads: list, writes: list, site) -> None:
    """The copy of a call's inputs into the buffers a captured graph reads (one task)."""
    op = "aten::_foreach_copy_" if len(writes) > 1 else "aten::copy_"
    rt.kernel(stream, op, reads, writes, cores=profiles.COPY, site=site)
