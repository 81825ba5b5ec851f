"""A test that waits for processes which can no longer answer: the wait is ended, not waited on.

Why: suites written for real cards start a process per rank and collect results over
``multiprocessing`` queues, often with no timeout (torch_npu's own distributed tests:
``c2p.get()``).  A rank that raises never puts its result, and the test waits forever (on hardware
too); under the emulator, where a rank may raise because something is not emulated, a run would hang.
The plugin never hangs a run.

While a test's children inherit the emulation (inherit.py), a watcher thread looks each second at the
processes the test started (Linux ``/proc``: the test process's children, their state, exit code and
CPU time; multiprocessing's resource tracker and forkserver are not the test's ranks).  When one of
them has exited with a non-zero code, the test's thread waits inside ``multiprocessing`` (a queue, a
pipe, a lock) and none of the test's live children ran (no thread running or runnable, almost no CPU
used) for ``GRACE`` seconds, nothing can
arrive: the watcher ends the wait with ``ChildrenEnded`` (raised in the test's thread from a signal
handler, which interrupts the blocking read) and ends the test's remaining children, which wait for
the test (left alive, they would also hold up the interpreter's exit, which joins them).  For the same
reason, when a test fails and leaves processes that wait (no thread running, no CPU used), they are
ended at its end.

No torch here.  Elsewhere than Linux, or outside the main thread, nothing is watched.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Optional

GRACE = float(os.environ.get("NPUGRAPH_ORPHAN_WAIT", "20"))   # seconds of a wait nothing can end
_IDLE_CPU = 0.05              # CPU seconds a child may use between two looks (a second) and still be waiting
_SIGNAL = getattr(signal, "SIGUSR2", None)
_MP = os.sep + "multiprocessing" + os.sep


class ChildrenEnded(RuntimeError):
    """The test waited in ``multiprocessing`` for processes that ended with an error or wait themselves."""


def _proc_children(pid: int) -> set:
    out = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def _stat(pid: int) -> Optional[tuple]:
    """(state, CPU seconds, exit code or None, a thread runs) of ``pid``; None when it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    if fields[0] == "Z":
        code = int(fields[49]) if len(fields) > 49 else 0
        status = code >> 8 if code & 0x7F == 0 else -(code & 0x7F)   # waitpid form: exit code, or -signal
        return fields[0], cpu, status, False
    running = fields[0] == "R"
    if not running:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "R":
                        running = True
                        break
        except OSError:
            pass
    return fields[0], cpu, None, running


def _helper(pid: int) -> bool:
    """multiprocessing's resource tracker or forkserver: started by the test, but not one of its ranks."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ")
    except OSError:
        return False
    return b"resource_tracker" in command or b"forkserver" in command


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_proc: dict = {}              # pid -> whether Linux /proc shows its tasks (asked once per process)


def _has_proc(pid: int) -> bool:
    found = _proc.get(pid)
    if found is None:
        found = _proc[pid] = sys.platform.startswith("linux") and os.path.isdir(f"/proc/{pid}/task")
    return found


class ChildWatch:
    """One test's watch (a context manager around the test's body).  One watcher thread per process
    serves every test's watch in turn: starting and joining a thread per test cost more than the rest
    of the watch (most tests start no process), so it is started with the first watch and then looks,
    once a second, at whichever watch is open."""

    def __init__(self, grace: Optional[float] = None):
        self.grace = GRACE if grace is None else grace
        self.pid = os.getpid()
        self.before: set = set()
        self.seen: dict = {}          # child pid -> exit code once seen ended (None while running)
        self.open = False
        self.previous = None
        self.fired: Optional[str] = None

    def usable(self) -> bool:
        return (_SIGNAL is not None and _has_proc(self.pid)
                and threading.current_thread() is threading.main_thread()
                and signal.getsignal(_SIGNAL) in (signal.SIG_DFL, None))

    def __enter__(self) -> "ChildWatch":
        global _open
        if not self.usable():
            return self
        self.before = _proc_children(self.pid)
        self.previous = signal.signal(_SIGNAL, self._interrupt)
        self.main = threading.main_thread().ident
        with _lock:
            _open = self
            self.open = True
        _start_watcher()
        return self

    def __exit__(self, exc_type=None, *exc) -> None:
        global _open
        if not self.open:
            return
        with _lock:                   # after this, the watcher never fires for this watch
            if _open is self:
                _open = None
            self.open = False
        signal.signal(_SIGNAL, self.previous if self.previous is not None else signal.SIG_DFL)
        if exc_type is not None:
            self._end_waiting_children()

    def _end_waiting_children(self) -> None:
        """The test failed and left processes that wait (for the test, which will never answer: a queue
        get, a barrier): ended, or the interpreter's exit, which joins them, would hang the run."""
        ended, last = [], {}
        deadline = time.monotonic() + 5.0        # a process still finishing its last put gets a few seconds
        while time.monotonic() < deadline:
            live = {pid: _stat(pid) for pid in _proc_children(self.pid) - self.before if not _helper(pid)}
            live = {pid: stat for pid, stat in live.items() if stat is not None and stat[0] != "Z" and pid not in ended}
            if not live:
                break
            for pid, now in live.items():
                before = last.get(pid)
                if before is not None and not now[3] and not before[3] and now[1] - before[1] <= _IDLE_CPU:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        ended.append(pid)
                    except OSError:
                        pass
            last = live
            time.sleep(0.5)
        if ended:
            print(f"npugraph: the test failed and left {len(ended)} process(es) waiting ({', '.join(map(str, ended))}); "
                  f"ended them (the interpreter's exit joins them, and would wait forever)", file=sys.stderr)

    # -- the watcher thread's look, once a second while this watch is open
    def _look(self, state: dict) -> None:
        """``state``: the watcher's memory of this watch (when it went quiet, children's CPU time)."""
        live, working, cpu = [], False, state["cpu"]
        for pid in _proc_children(self.pid) - self.before:
            if pid not in self.seen and _helper(pid):
                self.before.add(pid)
                continue
            stat = _stat(pid)
            if stat is None:
                continue
            if stat[0] == "Z":
                self.seen[pid] = stat[2]
                continue
            self.seen.setdefault(pid, None)
            live.append(pid)
            # working: a thread runs (or waits for a core) now, or it used CPU since the last look
            working |= stat[3] or stat[1] - cpu.get(pid, 0.0) > _IDLE_CPU
            cpu[pid] = stat[1]
        failed = {pid: code for pid, code in self.seen.items() if code not in (None, 0)}
        waiting = self._waits_in_multiprocessing()
        if not failed or not waiting or working:
            state["quiet_since"] = None
            return
        now = time.monotonic()
        if state["quiet_since"] is None:
            state["quiet_since"] = now
        elif now - state["quiet_since"] >= self.grace:
            with _lock:
                if _open is not self:          # the test ended meanwhile
                    return
                self.fired = self._message(waiting, failed, live)
                for pid in live:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                signal.pthread_kill(self.main, _SIGNAL)
            state["done"] = True

    def _waits_in_multiprocessing(self) -> Optional[str]:
        """Where the test's thread waits, if its innermost Python frame is in multiprocessing."""
        frame = sys._current_frames().get(self.main)
        if frame is None or _MP not in frame.f_code.co_filename:
            return None
        caller = frame
        while caller is not None and _MP in caller.f_code.co_filename:
            if caller.f_locals.get("timeout") is not None:
                return None           # a wait with a timeout ends by itself
            caller = caller.f_back
        inner = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
        if caller is not None:
            inner += f", called from {os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
        return inner

    def _message(self, where: str, failed: dict, live: list) -> str:
        ended = ", ".join(f"pid {pid} ended with " + (f"exit code {code}" if code > 0 else f"signal {-code}")
                          for pid, code in sorted(failed.items()))
        others = (f"; the others ({', '.join(map(str, sorted(live)))}) wait without working and were ended"
                  if live else "")
        return (f"npugraph: the test waits in multiprocessing ({where}) for the processes it started, but "
                f"{ended} (its error, if it printed one, is in the test's captured stderr){others}: nothing can arrive, so the "
                f"wait would last forever (on hardware too). npugraph ended it after {self.grace:g} s "
                f"(NPUGRAPH_ORPHAN_WAIT).")

    def _interrupt(self, signum, frame):
        if self.fired is not None:
            message, self.fired = self.fired, None
            raise ChildrenEnded(message)


_lock = threading.Lock()
_open: Optional[ChildWatch] = None      # the running test's watch
_watcher: Optional[threading.Thread] = None


def _start_watcher() -> None:
    global _watcher
    if _watcher is not None and _watcher.is_alive():
        return
    _watcher = threading.Thread(target=_watch, name="npugraph-child-watch", daemon=True)
    _watcher.start()


def _watch() -> None:
    """The watcher thread: once a second, a look at the open watch (a test's), if any."""
    watch, state = None, None
    never = threading.Event()
    while True:
        never.wait(1.0)     # not time.sleep: tests patch it (a sleep that returns at once would spin here)
        current = _open
        if current is None:
            watch = None
            continue
        if current is not watch:      # a new test: its first look (the previous test's memory goes)
            watch, state = current, {"quiet_since": None, "cpu": {}, "done": False}
        if state["done"]:
            continue
        try:
            watch._look(state)
        except Exception:  # noqa: BLE001 (a look that fails (a /proc race) must not end the watcher)
            state["quiet_since"] = None
