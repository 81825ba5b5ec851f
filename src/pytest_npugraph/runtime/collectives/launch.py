"""``npugraph.run_ranks(fn, processes=True)``: the rank function in one process per emulated device.

Why: code written for ``torch.multiprocessing.spawn`` or ``torchrun`` (a process per card, each with
its own globals, ``init_process_group`` over ``file://``/``tcp://``/``env://``) is tested the way it
runs.  Each rank is a spawned child of the test (inherit.py: it emulates the test's NPU and hands its
trace back) with ``torchrun``'s environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``), ``npu:rank`` as its current device and, when ``fn`` does not call
``init_process_group`` itself, an ``hccl`` world over a file store made at its first collective (as in
the thread ranks).  Its collectives meet the other ranks' through the store (processes.py).

Results and exceptions come back pickled; the test waits at most the collective timeout plus the time
processes take to start (``NPUGRAPH_PROCESS_TIMEOUT``, default 300 s) and then ends the ranks.
"""
from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
import traceback

from ..executor import DeviceHang
from .errors import CollectiveAborted, CollectiveError
from .ranks import DEFAULT_TIMEOUT

START_TIMEOUT = float(os.environ.get("NPUGRAPH_PROCESS_TIMEOUT", "300"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, size: int, fn, args: tuple, folder: str, port: int) -> None:
    """A rank process's body (spawned: the child bootstrap already made it emulate the test's NPU)."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(size),
                       "LOCAL_WORLD_SIZE": str(size), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    outcome = None
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        import torch_npu  # noqa: F401

        torch.npu.set_device(rank)
        original = c10d._get_default_group

        def get_default_group():
            if not c10d.is_initialized():
                dist.init_process_group("hccl", init_method=f"file://{os.path.join(folder, 'store')}",
                                        rank=rank, world_size=size)
            return original()
        c10d._get_default_group = get_default_group
        try:
            outcome = ("result", fn(rank, *args))
        finally:
            c10d._get_default_group = original
            if dist.is_initialized():
                from . import processes

                processes.finish_process()     # its queued collectives complete with the peers' first
                dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 (handed to the test)
        outcome = ("error", exc, traceback.format_exc())
    try:
        data = pickle.dumps(outcome)
    except Exception:  # noqa: BLE001 (an unpicklable result or exception: its text)
        if outcome[0] == "result":
            outcome = ("error", TypeError(f"rank {rank}'s result cannot be pickled: {outcome[1]!r}"), "")
        else:
            outcome = ("error", RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]}"), outcome[2])
        data = pickle.dumps(outcome)
    with open(os.path.join(folder, f"rank{rank}.pkl"), "wb") as f:
        f.write(data)


def run(fn, args: tuple, size: int) -> list:
    """Run ``fn(rank, *args)`` in ``size`` spawned processes; the results in rank order, or the first
    rank's exception (a device hang as ``DeviceHang``, for ``npugraph.expect("deadlock")``)."""
    from ... import inherit

    if inherit.active() is None:
        raise RuntimeError("npugraph.run_ranks(fn, processes=True) inside a test whose children do not inherit "
                           "the emulated NPU (@pytest.mark.npu_no_inherit)")
    try:
        pickle.dumps((fn, args))
    except Exception as exc:
        raise TypeError(f"npugraph.run_ranks(fn, processes=True): fn and args go to the rank processes by pickle: "
                        f"fn must be a module-level function of an importable module ({exc})") from None
    import torch.multiprocessing as mp

    folder = tempfile.mkdtemp(prefix="npugraph-ranks-", dir=inherit.active().folder())
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, size, fn, args, folder, port), name=f"npugraph-rank-{r}",
                         daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + START_TIMEOUT + DEFAULT_TIMEOUT
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        late = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        inherit.absorb()
    outcomes = {}
    for r in range(size):
        try:
            with open(os.path.join(folder, f"rank{r}.pkl"), "rb") as f:
                outcomes[r] = pickle.load(f)
        except FileNotFoundError:
            outcomes[r] = None
    if late:
        raise CollectiveError(f"npugraph.run_ranks(processes=True): rank(s) {', '.join(map(str, late))} still "
                              f"running after {START_TIMEOUT + DEFAULT_TIMEOUT:g} s; ended them (set "
                              f"NPUGRAPH_PROCESS_TIMEOUT to wait longer)")
    errors = [(r, o) for r, o in outcomes.items() if o is not None and o[0] == "error"]
    hangs = [(r, o) for r, o in errors if isinstance(o[1], DeviceHang)]
    first = [(r, o) for r, o in errors if not isinstance(o[1], (DeviceHang, CollectiveAborted))]
    chosen = first or hangs or errors
    if chosen:
        rank, (_, error, text) = chosen[0]
        note = f"(raised in rank process {rank} (npu:{rank}) of npugraph.run_ranks(processes=True))\n{text}"
        if hasattr(error, "add_note"):
            error.add_note(note)
        raise error
    missing = [r for r, o in outcomes.items() if o is None]
    if missing:
        codes = ", ".join(f"rank {r}: exit code {procs[r].exitcode}" for r in missing)
        raise CollectiveError(f"npugraph.run_ranks(processes=True): rank process(es) ended without a result ({codes})")
    return [outcomes[r][1] for r in range(size)]
