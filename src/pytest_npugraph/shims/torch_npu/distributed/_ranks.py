"""What ``torchrun`` gives each process, given to each rank thread of ``npugraph.run_ranks``.

* its own ``torch.distributed`` state: c10d keeps the default group and the group tables in
  one module-level ``_World``; while the ranks run it is replaced by one whose state is per
  thread, and c10d's C++ group registry is put in thread-isolation mode (both as torch's
  own threaded test process group does);
* its own environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR``/``MASTER_PORT`` are visible to that thread only (``os.environ`` is a view
  with per-thread variables on top while the ranks run; writes in a rank thread stay there);
* an in-process rendezvous: ``env://``, ``tcp://`` and ``file://`` init methods yield one
  shared ``HashStore`` instead of opening sockets or files, with the rank and world size
  from the arguments, else the (per-thread) environment;
* a default ``hccl`` group on demand: a rank function that uses ``torch.distributed`` without
  calling ``init_process_group`` gets one (rank r of world size = the emulated devices) at its
  first use, so both styles work.

Everything is undone when the ranks end (also ``sys.excepthook``, which each
``init_process_group`` wraps); the groups a rank left are destroyed in its thread.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pytest_npugraph.runtime import collectives as C

rdzv = importlib.import_module("torch.distributed.rendezvous")  # the attribute is a function
_SCHEMES = ("env", "tcp", "file")
_env = threading.local()

_WORLD_FIELDS = {"default_pg": lambda: None, "pg_map": dict, "pg_names": dict, "pg_group_ranks": dict,
                 "pg_backend_config": dict, "group_count": lambda: 0, "tags_to_pg": dict, "pg_to_tag": dict,
                 "pg_coalesce_state": dict, "comms": list}


class _ThreadLocalWorld(c10d._World):
    """c10d's ``_World`` with one state per thread."""

    def __init__(self):
        self._tls = threading.local()

    def _state(self) -> dict:
        state = getattr(self._tls, "state", None)
        if state is None:
            state = self._tls.state = {name: make() for name, make in _WORLD_FIELDS.items()}
        return state


def _world_field(name: str) -> property:
    def get(self):
        return self._state()[name]

    def set_(self, value):
        self._state()[name] = value
    return property(get, set_)


for _name in _WORLD_FIELDS:
    setattr(_ThreadLocalWorld, _name, _world_field(_name))


class _RankEnviron(os._Environ):
    """``os.environ`` with the calling rank thread's variables on top (None = deleted there)."""

    def __init__(self, base):
        self.__dict__.update(base.__dict__)
        self._base = base

    @staticmethod
    def _overlay():
        return getattr(_env, "overlay", None)

    def __getitem__(self, key):
        overlay = self._overlay()
        if overlay is not None and key in overlay:
            if overlay[key] is None:
                raise KeyError(key)
            return overlay[key]
        return self._base[key]

    def __setitem__(self, key, value):
        overlay = self._overlay()
        if overlay is None:
            self._base[key] = value
            return
        self.encodekey(key), self.encodevalue(value)   # the type checks os.environ makes
        overlay[key] = value

    def __delitem__(self, key):
        overlay = self._overlay()
        if overlay is None:
            del self._base[key]
            return
        self[key]  # KeyError if absent
        overlay[key] = None

    def __iter__(self):
        overlay = self._overlay() or {}
        yield from (k for k in self._base if k not in overlay)
        yield from (k for k, v in overlay.items() if v is not None)

    def __len__(self):
        return sum(1 for _ in self)

    def copy(self):
        return dict(self)

    def __repr__(self):
        return f"environ({dict(self)!r})"


def _rank_env(rank: int, size: int) -> dict:
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size),
           "GROUP_RANK": "0"}
    for key, default in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        if key not in os.environ:
            env[key] = default
    return env


def _in_process(job, store, original):
    """A rendezvous handler: rank threads of ``job`` meet in ``store``; others go to ``original``."""
    def handler(url, **kwargs):
        bound = C.binding()
        if bound is None or bound[0] is not job:
            yield from original(url, **kwargs)
            return
        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        rank = int(query.get("rank", os.environ.get("RANK", bound[1])))
        world_size = int(query.get("world_size", os.environ.get("WORLD_SIZE", job.size)))
        yield store, rank, world_size
        raise RuntimeError("Unable to perform re-rendezvous in npugraph.run_ranks")
    return handler


def _default_group_on_demand(job, original):
    """c10d's ``_get_default_group`` that, in a rank thread of ``job`` whose function did not call
    ``init_process_group``, first initialises the default ``hccl`` group (rank r of world size
    ``job.size``), as a torchrun-launched script's launcher environment would let it: both styles,
    with and without ``init_process_group`` in the rank function, work."""
    def get_default_group():
        bound = C.binding()
        if bound is not None and bound[0] is job and not c10d.is_initialized():
            dist.init_process_group("hccl", rank=bound[1], world_size=job.size)
        return original()
    get_default_group.__wrapped__ = original
    return get_default_group


class RankContext:
    """``collectives.run_ranks``'s ``context``: the job-wide and the per-rank setup."""

    @contextlib.contextmanager
    def __call__(self, job):
        saved_world, saved_environ, saved_hook = c10d._world, os.environ, sys.excepthook
        saved_default = c10d._get_default_group
        saved_handlers = {s: rdzv._rendezvous_handlers.get(s) for s in _SCHEMES}
        store = dist.HashStore()
        c10d._world = _ThreadLocalWorld()
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        for scheme, original in saved_handlers.items():
            if original is not None:
                rdzv._rendezvous_handlers[scheme] = _in_process(job, store, original)
        os.environ = _RankEnviron(saved_environ)
        c10d._get_default_group = _default_group_on_demand(job, saved_default)
        try:
            yield
        finally:
            c10d._get_default_group = saved_default
            sys.excepthook = saved_hook   # init_process_group wraps it with a "[rank0]" prefix
            os.environ = saved_environ
            rdzv._rendezvous_handlers.update({s: h for s, h in saved_handlers.items() if h is not None})
            torch._C._distributed_c10d._set_thread_isolation_mode(False)
            c10d._world = saved_world

    @contextlib.contextmanager
    def rank(self, job, rank: int):
        _env.overlay = _rank_env(rank, job.size)
        try:
            yield
        finally:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            finally:
                _env.overlay = None


CONTEXT = RankContext()
