"""A process started by a test (or by ``pytest-npugraph run``): it emulates the test's NPU and hands
its trace back when it exits (inherit.py says how it is found).

``start`` runs from ``sitecustomize`` before the child's own code: it puts the emulated packages in
front of the import system and gives the runtime the test's configuration, and a hook relay
(``ChildHook``) in place of pytest's: the parent's answers for the collectives, then the conftest.py
files' hooks.  No torch is imported here; the child's ``import torch_npu`` builds the runtime.

At exit the process's ranks finish (``collectives`` of a rank process wait for their peers: a rank
that leaves with work its peers never match is a device hang) and the trace is pickled into the
test's folder as ``<pid>-<n>.trace.pkl``: ``(meta, trace)``, meta naming the rank and the command.
"""
from __future__ import annotations

import atexit
import importlib.util
import inspect
import json
import os
import pickle
import sys
import time
from typing import Optional

from . import inherit

_directory: Optional[str] = None
_pid: Optional[int] = None
_written = 0


class ChildHook:
    """The child's stand-in for pytest's hook relay (``CONTEXT.hook``)."""

    def __init__(self, profiles: dict, conftests: list):
        self.profiles = profiles
        self.conftests = conftests
        self._modules: Optional[list] = None

    def _impls(self, name: str) -> list:
        if self._modules is None:
            self._modules = []
            for i, path in enumerate(self.conftests):
                try:
                    spec = importlib.util.spec_from_file_location(f"_npugraph_conftest_{i}", path)
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    self._modules.append(module)
                except Exception as exc:  # noqa: BLE001 (the child goes on with the parent's answers)
                    print(f"npugraph: a child process could not import {path}: {exc!r}", file=sys.stderr)
        return [getattr(m, name) for m in reversed(self._modules) if hasattr(m, name)]   # nearest first

    @staticmethod
    def _call(fn, **kwargs):
        accepted = inspect.signature(fn).parameters
        return fn(**{k: v for k, v in kwargs.items() if k in accepted})

    def pytest_npugraph_op_profile(self, op_name):
        if op_name in self.profiles:
            return self.profiles[op_name]
        for fn in self._impls("pytest_npugraph_op_profile"):
            answer = self._call(fn, op_name=op_name)
            if answer is not None:
                return answer
        return None

    def pytest_npugraph_register_ops(self, registry):
        for fn in self._impls("pytest_npugraph_register_ops"):
            self._call(fn, registry=registry)

    def pytest_npugraph_hazard(self, item, hazard):
        return None


def start(directory: str, forked: bool = False) -> None:
    """Make this process a child of the test whose folder is ``directory``."""
    global _directory, _pid
    if _pid == os.getpid():
        return
    from . import activation
    from ._context import CONTEXT

    if forked:      # the test process's own state came along: only start a fresh runtime (a new generation)
        CONTEXT.begin(CONTEXT.config, CONTEXT.test_hook)
    else:
        data = json.loads(os.environ[inherit.CONFIG_ENV])
        activation.activate()
        CONTEXT.hook = ChildHook(data.get("profiles", {}), data.get("conftests", []))
        CONTEXT.begin(inherit.test_config(data["config"]), None)
    CONTEXT.emulating = True
    CONTEXT.child = True
    os.environ[inherit.ENV] = directory
    _directory, _pid = directory, os.getpid()
    atexit.register(write_trace)
    if hasattr(os, "register_at_fork") and not getattr(start, "_registered", False):
        start._registered = True
        os.register_at_fork(after_in_child=lambda: _directory and start(_directory, forked=True))
        watch_forks()


class _ForkHook:
    pass


_FORK_HOOK = _ForkHook()


def watch_forks() -> None:
    """multiprocessing's fork children leave through ``os._exit`` (no atexit): their trace is written by
    a multiprocessing finalizer, registered once the child's bootstrap has cleared the parent's."""
    from multiprocessing import util

    util.register_after_fork(_FORK_HOOK, _finalize_forked)


def _finalize_forked(_hook) -> None:
    if _pid == os.getpid():
        from multiprocessing import util

        util.Finalize(None, write_trace, exitpriority=100)


def rank() -> Optional[int]:
    """This process's rank: its process group's, else the launcher's ``RANK``."""
    module = sys.modules.get("pytest_npugraph.runtime.collectives.processes")
    job = module.current_job() if module is not None else None
    if job is not None:
        return job.rank
    value = os.environ.get("RANK")
    return int(value) if value is not None and value.isdigit() else None


def write_trace() -> Optional[str]:
    """Finish this process's ranks and write its trace (once; nothing if it never used the NPU)."""
    global _written
    if _pid != os.getpid() or _written:
        return None
    _written = 1
    module = sys.modules.get("pytest_npugraph.runtime.runtime")
    rt = module.peek() if module is not None else None
    if rt is None:
        return None
    ranks = sys.modules.get("pytest_npugraph.runtime.collectives.processes")
    if ranks is not None:
        try:
            ranks.finish_process()
        except Exception as exc:  # noqa: BLE001 (reported by the trace: the deadlock analysis names it)
            print(f"npugraph: rank {rank()} (pid {os.getpid()}) at exit: {exc}", file=sys.stderr)
    from . import trace as T

    trace = rt.trace
    with rt.lock:
        snapshot = T.Trace(list(trace.records), dict(trace.streams), dict(trace.events), dict(trace.blocks))
    meta = {"pid": os.getpid(), "rank": rank(), "argv": list(sys.argv), "order": time.time(),
            "worlds": dict(rt.extensions.get("collectives.world_tokens", {}))}
    name = f"{os.getpid()}-{time.monotonic_ns()}{inherit.SUFFIX}"
    path = os.path.join(_directory, name)
    try:
        os.makedirs(_directory, exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            pickle.dump((meta, snapshot), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(path + ".tmp", path)
    except Exception as exc:  # noqa: BLE001
        print(f"npugraph: could not write the trace of pid {os.getpid()}: {exc!r}", file=sys.stderr)
        return None
    return path


def stop() -> None:
    """This process is a pytest session after all (a test ran ``pytest`` in a subprocess): it follows its
    own options, writes no trace for the parent, and its own children are not the parent test's."""
    global _written
    from . import activation
    from ._context import CONTEXT

    if not CONTEXT.child:
        return
    _written = 1
    CONTEXT.child = False
    CONTEXT.hook = None
    CONTEXT.emulating = False
    activation.deactivate()
    os.environ.pop(inherit.ENV, None)
    os.environ.pop(inherit.CONFIG_ENV, None)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != inherit.BOOTSTRAP]
    if paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        os.environ.pop("PYTHONPATH", None)
