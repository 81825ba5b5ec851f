"""Autograd's streams: each backward op runs on the stream of its forward op, with the waits torch's
autograd engine inserts (torch docs, notes/cuda.rst, "Stream semantics of backward passes").

Why here: torch's engine learns a node's stream from the device guard when the forward op records
the node, and sets it (and syncs producer and consumer streams) when the node runs.  torch 2.13's
Python device guard forwards none of that, so without this module every backward op of an NPU
graph runs on npu:N's default stream of the engine's worker thread: ``with torch.npu.stream(s):
loss.backward(); use(x.grad)`` (torch's documented safe pattern) reports races and missing
record_streams, and a backward inside a graph capture escapes the capture.

What is emulated:

* a node's stream is the stream current on its device in the thread that recorded it, when it was
  recorded: ``Runtime.set_current_stream`` notes each change with the thread's autograd sequence
  number (``ThreadState.stream_history``), and a node's ``_sequence_nr()`` finds its entry.  Nodes
  without a sequence number (``AccumulateGrad`` of a leaf) take the stream of the node that feeds
  them (torch: the stream current when the leaf was first used, in the op that used it);
* before the engine runs (``backward``/``grad``, through ``_engine_run_backward``) the graph is walked
  from its roots and each NPU node gets a pre-hook and a post-hook, removed when the call returns;
  the engine runs every node on the calling thread (``set_multithreading_enabled(False)``): its
  per-device threads are numbered by the device guard's count, which a Python guard gives as 1, so
  a backward on npu:1 would otherwise fail torch's internal assert;
* pre-hook of node N: the engine thread's current device and stream become N's; N's stream waits for
  each producer of its gradients that ran on another stream (an event recorded on the producer's
  stream now), and a root waits for the caller's current stream (the initial gradient);
* post-hook of node P: P's stream stays current (the engine accumulates P's gradient into its
  consumers' buffers next) after waiting for the other producers of those consumers on other streams;
* after the engine: the caller's current stream waits for every stream the backward ran on (torch
  syncs the leaf streams; every backward stream feeds a leaf, so the order is the same).

Limits: a node recorded in another thread than the one calling backward is looked up in the calling
thread's history; the engine's own accumulation is placed on the producer's stream (torch: the
consumer's, after the same waits).
"""
from __future__ import annotations

import bisect
import threading

import torch
from .callsite import user_site
_NO_SEQUENCE = 1 << 62          # AccumulateGrad and the like: UINT64_MAX
_installed = False
_engine_run_backward = None


def _npu_device(node):
    """The npu device index of the node's gradient inputs, or None (a CPU node)."""
    try:
        metas = node._input_metadata
    except (AttributeError, RuntimeError):
        return None
    for m in metas:
        d = m.device
        if d.type == "npu":
            return d.index
    return None


def _recorded_stream(rt, history: dict, device: int, seq: int):
    """The stream current on ``device`` in the calling thread when node ``seq`` was recorded."""
    entries = history.get(device)
    if entries:
        i = bisect.bisect_right(entries, seq, key=lambda e: e[0])
        if i:
            return entries[i - 1][1]
    return rt.devices[device].default_stream


class _Backward:
    """One call into the engine: node streams, hooks, and the syncs around them."""

    def __init__(self, rt, roots: list):
        self.rt = rt
        self.site = user_site(4)
        caller = rt.thread()
        self.caller = caller
        self.saved = (caller.device, dict(caller.streams), caller.site)
        self.stream: dict = {}          # node -> StreamState (NPU nodes only)
        self.producers: dict = {}       # node -> nodes feeding it gradients
        self.consumers: dict = {}       # node -> nodes it feeds
        self.ran: set = set()           # nodes whose pre-hook ran
        self.used: set = set()          # streams backward work ran on
        self.roots: dict = {}           # root node -> the event of the caller's stream it waits for
        self.handles: list = []
        self._walk(roots)

    # ---------------------------------------------------------------- before the engine
    def _walk(self, roots) -> None:
        rt, history = self.rt, self.caller.stream_history
        seen = {}
        todo = []
        for node in roots:
            if node is not None and node not in seen:
                seen[node] = None
                todo.append((node, None))
        while todo:
            node, parent = todo.pop()
            device = _npu_device(node)
            stream = None
            if device is not None:
                seq = node._sequence_nr()
                if seq >= _NO_SEQUENCE and parent is not None and self.stream.get(parent) is not None \
                        and self.stream[parent].device == device:
                    stream = self.stream[parent]
                else:
                    stream = _recorded_stream(rt, history, device, seq)
                self.stream[node] = stream
            for nxt, _ in node.next_functions:
                if nxt is None:
                    continue
                self.consumers.setdefault(node, []).append(nxt)
                self.producers.setdefault(nxt, []).append(node)
                if nxt not in seen:
                    seen[nxt] = None
                    todo.append((nxt, node))
        for node in self.stream:
            self.handles.append(node.register_prehook(self._pre(node)))
            self.handles.append(node.register_hook(self._post(node)))
        for node in roots:
            stream = self.stream.get(node)
            if stream is None:
                continue
            caller = rt.current_stream(stream.device)
            if caller is not stream:      # the initial gradient is the caller's stream's
                event = rt.new_event("autograd root", numbered=False)
                rt.record_event(event, caller, self.site)
                self.roots[node] = event

    # ---------------------------------------------------------------- hooks (engine threads)
    def _pre(self, node):
        def hook(grad_outputs):
            rt, stream = self.rt, self.stream[node]
            rt.set_current_device(stream.device)
            rt.set_current_stream(stream)
            rt.set_site_hint(self.site)
            with self.lock:
                self.ran.add(node)
                self.used.add(stream)
                others = {self.stream.get(p) for p in self.producers.get(node, ()) if p in self.ran}
            self._wait_for(others, stream)
            event = self.roots.get(node)
            if event is not None:
                rt.wait_event(event, stream, self.site)
        return hook

    def _post(self, node):
        def hook(grad_inputs, grad_outputs):
            stream = self.stream[node]
            with self.lock:
                others = {self.stream.get(q) for c in self.consumers.get(node, ()) for q in self.producers.get(c, ())
                          if q is not node and q in self.ran}
            self._wait_for(others, stream)        # the accumulation into the consumers' buffers reads them
            self.rt.set_current_stream(stream)
        return hook

    lock = threading.Lock()

    def _wait_for(self, streams, stream) -> None:
        for other in streams:
            if other is not stream and other is not None:
                event = self.rt.new_event("autograd", numbered=False)
                self.rt.record_event(event, other, self.site)
                self.rt.wait_event(event, stream, self.site)

    # ---------------------------------------------------------------- after the engine
    def finish(self, completed: bool) -> None:
        for handle in self.handles:
            handle.remove()
        rt, caller = self.rt, self.caller
        device, streams, caller.site = self.saved
        if caller is rt.thread():       # the engine may have run nodes on the calling thread: back as it was
            for d in list(caller.streams):
                if caller.streams[d] is not streams.get(d, rt.devices[d].default_stream):
                    rt.set_current_stream(streams.get(d, rt.devices[d].default_stream))
            caller.device = device
        if not completed:
            return
        for stream in sorted(self.used, key=lambda s: s.sid):
            mine = rt.current_stream(stream.device)
            if mine is not stream:
                event = rt.new_event("autograd leaves", numbered=False)
                rt.record_event(event, stream, self.site)
                rt.wait_event(event, mine, self.site)


def _roots(t_outputs) -> list:
    roots = []
    for t in t_outputs:
        node = getattr(t, "node", None) if not isinstance(t, torch.Tensor) else t.grad_fn
        if node is not None:
            roots.append(node)
    return roots


def _run_backward(t_outputs, *args, **kwargs):
    """``torch.autograd.graph._engine_run_backward`` with NPU stream semantics (module docstring)."""
    from .runtime import peek

    rt = peek()
    if rt is None:                      # this test made no NPU state: nothing of ours in the graph
        return _engine_run_backward(t_outputs, *args, **kwargs)
    outputs = tuple(t_outputs) if isinstance(t_outputs, (tuple, list)) else (t_outputs,)
    run = _Backward(rt, _roots(outputs))
    completed = False
    try:
        # every node on the calling thread: the engine's device threads number the devices by the
        # device guard's count, which a Python guard gives as 1 (npu:1's nodes would hit its assert)
        with torch.autograd.set_multithreading_enabled(False):
            result = _engine_run_backward(t_outputs, *args, **kwargs)
        completed = True
        return result
    finally:
        run.finish(completed)


def install() -> None:
    """Route ``backward``/``grad`` through ``_run_backward`` (idempotent)."""
    global _installed, _engine_run_backward
    if _installed:
        return
    import torch.autograd
    import torch.autograd.graph

    _engine_run_backward = torch.autograd.graph._engine_run_backward
    torch.autograd.graph._engine_run_backward = _run_backward
    if getattr(torch.autograd, "_engine_run_backward", None) is _engine_run_backward:
        torch.autograd._engine_run_backward = _run_backward
    _installed = True
