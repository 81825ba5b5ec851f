"""Processes a test starts inherit its emulated NPU (issue 28); their traces come back to it.

Why: launchers and libraries start Python processes of their own (``torch.multiprocessing.spawn``,
``torchrun``-style ranks, vLLM's model inspection in ``python -m ...``): under a test they must
import the emulated ``torch_npu``/``torchair``/``npugraph_ex`` with the test's chip, devices and
options, and what they run on the NPU must be checked with the test's own trace.

While a test runs, the plugin sets two environment variables (restored after the test):

* ``NPUGRAPH_CHILD``: a per-test folder where each child writes its trace when it exits (made by the
  first child that writes one: most tests start no process, and a folder costs milliseconds);
* ``NPUGRAPH_CHILD_CONFIG``: the test's ``TestConfig`` as JSON, with the ``pytest_npugraph_op_profile``
  answers for the collectives and the conftest.py files that answer the rest;
* ``PYTHONPATH``: ``bootstrap/`` first, whose ``sitecustomize`` starts ``child.start()`` in every
  Python process that sees ``NPUGRAPH_CHILD`` (it does nothing otherwise, and runs the next
  ``sitecustomize`` on the path).

A test that waits in ``multiprocessing`` for children that ended with an error is ended, not left
hanging (child_watch.py).  ``multiprocessing``'s fork children inherit the emulation with the process: ``os.register_at_fork``
makes them children the same way.  A forkserver started during the test is stopped after it (it
would hand the next test's children this test's settings).  ``@pytest.mark.npu_no_inherit`` turns
it off for one test.  No torch here: the plugin imports this module at start-up.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
from typing import Optional

ENV = "NPUGRAPH_CHILD"
CONFIG_ENV = "NPUGRAPH_CHILD_CONFIG"
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
SUFFIX = ".trace.pkl"
# the collectives whose core profile the analyses weigh: the parent answers for them once, at the test's start
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "gather",
               "scatter", "barrier", "send", "recv", "npu_moe_distribute_dispatch", "npu_moe_distribute_combine",
               "npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2", "npu_mm_all_reduce_base",
               "npu_all_gather_base_mm", "npu_mm_reduce_scatter_base")

_active: Optional["Inheritance"] = None      # the running test's, in the pytest process


def config_dict(config, ask=None, conftests=()) -> dict:
    """``TestConfig`` as JSON (every field, so fields added later travel too) plus the hook's answers."""
    data = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "chip":
            value = _chip_dict(value)
        elif isinstance(value, (set, frozenset, tuple)):
            value = sorted(value)
        data[f.name] = value
    profiles = {}
    if ask is not None:
        for name in COLLECTIVES:
            answer = ask(name)
            if answer is None or isinstance(answer, dict):
                profiles[name] = answer
    return {"config": data, "profiles": profiles, "conftests": list(conftests)}


_chips: dict = {}     # ChipProfile -> its dict (a frozen value: one per chip and process)


def _chip_dict(chip) -> dict:
    found = _chips.get(chip)
    if found is None:
        found = _chips[chip] = dataclasses.asdict(chip)
    return dict(found)


def test_config(data: dict):
    """The ``TestConfig`` of ``config_dict(...)["config"]``."""
    from ._context import TestConfig
    from .chips import ChipProfile

    fields = {f.name: f for f in dataclasses.fields(TestConfig)}
    values = {}
    for name, value in data.items():
        if name not in fields:
            continue                      # a parent of a newer version: ignore what this one lacks
        if name == "chip":
            value = ChipProfile(**value)
        elif name == "allow":
            value = frozenset(value)
        values[name] = value
    return TestConfig(**values)


class Inheritance:
    """One test's children: the environment they see, and their traces."""

    def __init__(self, config, ask=None, conftests=()):
        """``ask(op_name)``: the op profile hook's answer (``CONTEXT.op_profile``)."""
        global _made
        _made += 1
        self.directory = os.path.join(_base(), f"test-{_made}")
        self.absorbed: set = set()
        self.count = 0                    # child traces appended to the test's trace so far
        self.worlds: dict = {}            # (world label ("", "@w1"), token) -> the suffix of its names
        self.config = json.dumps(config_dict(config, ask, conftests))
        self.saved: dict = {}
        self.forkserver = _forkserver_running()

    def __enter__(self) -> "Inheritance":
        global _active
        for key in (ENV, CONFIG_ENV, "PYTHONPATH"):
            self.saved[key] = os.environ.get(key)
        os.environ[ENV] = self.directory
        os.environ[CONFIG_ENV] = self.config
        paths = [p for p in (os.environ.get("PYTHONPATH") or "").split(os.pathsep) if p and p != BOOTSTRAP]
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP] + paths)
        self.outer, _active = _active, self       # (an in-process pytester session's test runs inside ours)
        if not _watching:
            _watch_forks()
        from .child_watch import ChildWatch

        self.watch = ChildWatch().__enter__()      # a wait on children that ended is ended, not waited on
        return self

    def __exit__(self, *exc) -> None:
        global _active
        self.watch.__exit__(*exc)
        _active = self.outer
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not self.forkserver and _forkserver_running():
            _stop_forkserver()
        if os.path.isdir(self.directory):      # the children's traces were read by then
            shutil.rmtree(self.directory, ignore_errors=True)

    def folder(self) -> str:
        """The test's folder, made now if no child made it yet."""
        os.makedirs(self.directory, exist_ok=True)
        return self.directory

    def group_names(self, worlds: dict, claim):
        """How a child's communicator names read in the test's trace: the first world of ranks in the
        test (one token: processes.py) keeps its names; any later one (the test starting ranks again,
        as processes or as threads) gets ``~n``, ``n`` from ``claim()`` (collectives.claim_world, which
        numbers the thread jobs too), so its collectives never pair with another world's."""
        suffixes = {}
        for label, token in worlds.items():
            if (label, token) not in self.worlds:
                n = claim()
                self.worlds[(label, token)] = f"~{n}" if n > 1 else ""
            suffixes[label] = self.worlds[(label, token)]

        def rename(name: str) -> str:
            found = re.search(r"@w\d+", name)
            return name + suffixes.get(found.group(0) if found else "", "")
        return rename

    def new_traces(self) -> list:
        """``(meta, trace)`` of each child trace written since the last call, in the order written."""
        return new_traces(self.directory, self.absorbed)


_made = 0
_base_dir: Optional[str] = None


def _base() -> str:
    """This process's folder of per-test folders (made once, removed at exit)."""
    global _base_dir
    if _base_dir is None:
        import atexit

        _base_dir = tempfile.mkdtemp(prefix="npugraph-children-")
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(_base_dir, True))   # (not a fork's)
    return _base_dir


def new_traces(directory: str, absorbed: set) -> list:
    try:
        names = [n for n in os.listdir(directory) if n.endswith(SUFFIX) and n not in absorbed]
    except FileNotFoundError:
        return []
    out = []
    for name in sorted(names, key=lambda n: os.path.getmtime(os.path.join(directory, n))):
        absorbed.add(name)
        try:
            with open(os.path.join(directory, name), "rb") as f:
                meta, trace = pickle.load(f)
        except Exception as exc:  # noqa: BLE001 (a child killed while writing: say so, go on)
            print(f"npugraph: could not read the trace of a child process ({name}): {exc!r}", file=sys.stderr)
            continue
        out.append((meta, trace))
    out.sort(key=lambda mt: (mt[0].get("rank") is None, mt[0].get("rank") or 0, mt[0].get("order", 0)))
    return out


def active() -> Optional[Inheritance]:
    return _active


def absorb(inheritance: Optional[Inheritance] = None) -> int:
    """Append the traces the running test's children wrote since the last call to the test's trace
    (``trace_merge``); returns how many.  Imports the runtime (torch) only when there is one."""
    inh = inheritance or _active
    if inh is None:
        return 0
    found = inh.new_traces()
    if not found:
        return 0
    from . import trace_merge
    from .runtime.collectives import claim_world
    from .runtime.runtime import current

    rt = current()
    with rt.lock:
        for meta, trace in found:
            inh.count += 1
            label = f"rank {meta['rank']}" if meta.get("rank") is not None else f"pid {meta['pid']}"
            names = inh.group_names(meta.get("worlds", {}), lambda: claim_world(rt))
            trace_merge.append(rt.trace, trace, inh.count, label, names)
    return len(found)


def conftest_files(item) -> list:
    """The conftest.py files above ``item`` that answer the plugin's hooks (a child imports them)."""
    try:
        modules = item.config.pluginmanager._getconftestmodules(item.path.parent)
    except Exception:  # noqa: BLE001 (a private pytest API: without it, children use the precomputed answers)
        return []
    return [m.__file__ for m in modules if getattr(m, "__file__", None) and
            (hasattr(m, "pytest_npugraph_op_profile") or hasattr(m, "pytest_npugraph_register_ops"))]


def _forkserver_running() -> bool:
    module = sys.modules.get("multiprocessing.forkserver")
    server = getattr(module, "_forkserver", None)
    return bool(server is not None and getattr(server, "_forkserver_pid", None))


def _stop_forkserver() -> None:
    server = sys.modules["multiprocessing.forkserver"]._forkserver
    stop = getattr(server, "_stop", None)
    if stop is not None:
        stop()


_watching = False


def _watch_forks() -> None:
    global _watching
    from . import child

    child.watch_forks()
    _watching = True


def _after_fork_in_child() -> None:
    """A fork of the test process while a test runs: a child of that test (``child.start``)."""
    if _active is not None:
        from . import child

        child.start(_active.directory, forked=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
