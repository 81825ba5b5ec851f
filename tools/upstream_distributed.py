"""The upstream yardstick of issue 28: torch_npu's own multi-process distributed tests under the plugin.

Why: they are written for real cards (``torch.multiprocessing`` spawn of one process per rank,
``init_process_group("hccl")`` over ``env://``, queues back to the parent) with torch_npu's public API,
so how many pass under the emulator measures how far "ranks as processes" carries real suites.

Usage (``--repo``: a checkout of github:Ascend/pytorch, or a bare git directory such as the ``fetch``
mirror, read at ``--ref``)::

    python tools/upstream_distributed.py --repo /path/to/Ascend-pytorch [--ref HEAD]
        [--files test_allreduce ...] [--stall 90] [--test-timeout 1200] [--file-timeout 3600] [--out results.json]
        [--keep DIR]

Each file runs in its own ``python -m pytest -v -p no:randomly -p no:cacheprovider`` (the plugin
emulates ``torch_npu``; test/distributed's top-level modules are copied into a scratch folder, as some
import their siblings, so the checkout's conftest/pytest.ini stay out).  A ``conftest.py`` beside the
copies marks every test ``npu_devices(8)`` (a machine of 8 cards) and logs each test's start and
outcome (with the crash line: its cause) to a JSON-lines file as it happens.  A test whose processes
(pytest and the rank processes it started: one process group) stop making progress is a **hang**: no
process started or ended and less than a second of CPU used in ``--stall`` seconds (a slow test that
starts ranks one world after another is not one); a test still working after ``--test-timeout`` is
**slow** (many upstream tests start a world per dtype and format: 40 worlds of 2 processes).  The group
is then ended and the file starts again without the tests already seen, so one costs one test; tests
not reached within ``--file-timeout`` are "not run".  Upstream hard-codes ``MASTER_PORT=29500``: files run one at a time.

Printed: passed / failed / errors / skipped / hung per file, the totals, and the causes by count (the
crash line with numbers and addresses folded, so one cause counts once).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# torch_npu test/distributed files that run ranks as processes through the public torch.distributed API
FILES = (
    "test_all_to_all", "test_all_to_all_single", "test_allgather", "test_allgather_base",
    "test_allgather_into_tensor", "test_allreduce", "test_batch_isend_irecv", "test_broadcast",
    "test_c10d_object_collectives", "test_coalesced_manager", "test_comm_hook", "test_data_parallel",
    "test_functional_differentials", "test_gather", "test_reduce", "test_reduce_scatter",
    "test_reduce_scatter_base", "test_reduce_scatter_tensor", "test_scatter", "test_send_recv",
    "test_avoid_record_stream", "test_distributed", "test_zero_redundancy_optimizer", "test_device",
    "test_pg_wrapper",
)

LOG_ENV = "NPUGRAPH_UPSTREAM_LOG"
STACKS_ENV = "NPUGRAPH_UPSTREAM_STACKS"

# every Python process of a file's run (pytest, its rank processes: the plugin's child bootstrap runs the
# next sitecustomize on the path) dumps its threads' stacks on SIGUSR1, which the harness sends a hang
SITECUSTOMIZE = """
import faulthandler, os, signal
_folder = os.environ.get("%s")
if _folder:
    os.makedirs(_folder, exist_ok=True)
    _stacks = open(os.path.join(_folder, "%%d.txt" %% os.getpid()), "w")
    faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)
""" % STACKS_ENV

CONFTEST = """
import json, os, re, time
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.npu_devices(8))

def _log(entry):
    with open(os.environ["%s"], "a") as f:
        f.write(json.dumps(entry) + "\\n")

def pytest_runtest_logstart(nodeid, location):
    _log({"start": nodeid, "time": time.time()})

def pytest_runtest_logreport(report):
    if report.when != "call" and report.passed:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        cause = crash.message
    elif isinstance(report.longrepr, tuple):
        cause = str(report.longrepr[2])
    else:
        cause = str(report.longrepr or "")
    # a rank process's own error (the test itself often says only "subprocess exit with abnormal code")
    child = [line for line in (report.capstderr or "").splitlines()
             if re.match(r"[A-Za-z_][\\w.]*(Error|Exception|Hang|Aborted|Exit)\\b", line)]
    if child:
        cause = cause.splitlines()[0][:80] + " <- rank: " + child[-1] if cause else child[-1]
    _log({"report": report.nodeid, "when": report.when, "outcome": report.outcome, "cause": cause})
    if report.failed:
        with open(os.environ["%s"] + ".failures", "a") as f:
            f.write("=" * 30 + " " + report.nodeid + " (" + report.when + ")\\n" + report.longreprtext + "\\n"
                    + (report.capstderr or "")[-6000:] + "\\n")
""" % (LOG_ENV, LOG_ENV)


def sources(repo: str, ref: str) -> dict:
    """test/distributed's top-level ``.py`` files: name -> text (from a work tree, else from git)."""
    tree = os.path.join(repo, "test", "distributed")
    if os.path.isdir(tree):
        out = {}
        for name in os.listdir(tree):
            if name.endswith(".py"):
                with open(os.path.join(tree, name), encoding="utf-8") as f:
                    out[name] = f.read()
        return out
    git = ["git", "--git-dir", repo]
    names = subprocess.run(git + ["ls-tree", "--name-only", f"{ref}:test/distributed"], check=True,
                           capture_output=True, text=True).stdout.split()
    return {n: subprocess.run(git + ["show", f"{ref}:test/distributed/{n}"], check=True, capture_output=True,
                              text=True).stdout for n in names if n.endswith(".py")}


def _read_log(path: str) -> list:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _outcomes(entries: list) -> dict:
    """nodeid -> (outcome, cause) from the conftest's log: a setup/teardown failure is an error."""
    out: dict = {}
    for e in entries:
        if "start" in e:
            out.setdefault(e["start"], ("running", ""))
            continue
        nodeid, when, outcome = e["report"], e["when"], e["outcome"]
        if outcome == "skipped":
            out[nodeid] = ("skipped", "")
        elif outcome == "failed":
            kind = "failed" if when == "call" else "error"
            if out.get(nodeid, ("",))[0] not in ("failed", "error"):
                out[nodeid] = (kind, _cause(e["cause"]))
        elif when == "call":
            out[nodeid] = ("passed", "")
    return out


def _group_progress(pgid: int) -> tuple:
    """(pids, CPU seconds) of the live processes of process group ``pgid`` (Linux /proc)."""
    pids, ticks = [], 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry))
            ticks += int(fields[11]) + int(fields[12])
    return frozenset(pids), ticks / os.sysconf("SC_CLK_TCK")


def run_file(files: dict, name: str, test_timeout: float, stall: float, file_timeout: float,
             scratch: str, cann: str = "") -> dict:
    folder = os.path.join(scratch, name)
    os.makedirs(folder, exist_ok=True)
    for module, text in files.items():
        with open(os.path.join(folder, module), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(folder, "conftest.py"), "w") as f:
        f.write(CONFTEST)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    log = os.path.join(folder, "tests.jsonl")
    for old in (log, log + ".failures"):
        if os.path.exists(old):
            os.remove(old)
    env = dict(os.environ, NPUGRAPH_COLLECTIVE_TIMEOUT=os.environ.get("NPUGRAPH_COLLECTIVE_TIMEOUT", "60"))
    env[LOG_ENV] = log
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), folder) if p)
    # bytecode cached outside the trees (an environment that writes none recompiles every rank's imports)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(scratch, "pycache"))
    stacks_of: dict = {}
    started = time.monotonic()
    hung: list = []
    attempt = 0
    collect_error = None
    while True:
        seen = _outcomes(_read_log(log))
        command = [sys.executable, "-m", "pytest", "-v", "-p", "no:randomly", "-p", "no:cacheprovider",
                   "--rootdir", folder, os.path.join(folder, name + ".py")]
        command += [f"--deselect={nodeid}" for nodeid in seen]
        if cann:
            command.append(f"--npu-cann={cann}")
        output_path = os.path.join(folder, f"output{attempt}.txt")
        env[STACKS_ENV] = os.path.join(folder, f"stacks{attempt}")
        with open(output_path, "w") as out:
            proc = subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            stalled = None
            last = (None, None, 0.0, time.monotonic())   # test, pids, CPU seconds, when they last moved
            while proc.poll() is None:
                time.sleep(2.0)
                entries = _read_log(log)
                state = _outcomes(entries)
                running = [e for e in entries if "start" in e and state.get(e["start"], ("",))[0] == "running"]
                test = running[-1]["start"] if running else None
                pids, cpu = _group_progress(proc.pid)
                if test != last[0] or pids != last[1] or cpu - last[2] > 1.0:
                    last = (test, pids, cpu, time.monotonic())
                if test and time.monotonic() - last[3] > stall:
                    stalled, why = test, "hang"
                elif test and time.time() - running[-1]["time"] > test_timeout:
                    stalled, why = test, "slow"
                elif time.monotonic() - started > file_timeout:
                    stalled, why = (test or "(the file)"), "slow"
                if stalled:
                    os.killpg(proc.pid, signal.SIGUSR1)     # every process says where it waits (SITECUSTOMIZE)
                    time.sleep(3.0)
                    os.killpg(proc.pid, signal.SIGKILL)     # the file's pytest and the rank processes it started
                    proc.wait()
                    break
        try:
            os.killpg(proc.pid, signal.SIGKILL)             # rank processes left behind by a finished file
        except ProcessLookupError:
            pass
        if stalled is None:
            if attempt == 0 and not _read_log(log):
                with open(output_path, errors="replace") as f:
                    text = f.read()
                if re.search(r"ERROR collecting|Interrupted: \d+ error", text):
                    errors = re.findall(r"^E\s+(\w[\w.]*(?:Error|Exception)\b.*)$", text, re.M)
                    collect_error = _cause(errors[-1] if errors else text[-3000:])
            break
        hung.append((stalled, why))
        stacks_of[stalled] = _stacks(env[STACKS_ENV], proc.pid)
        with open(log, "a") as f:
            f.write(json.dumps({"report": stalled, "when": "call", "outcome": why, "cause": ""}) + "\n")
        if time.monotonic() - started > file_timeout:
            break
        attempt += 1
    if collect_error and "object has no attribute 'runTest'" in collect_error:
        return _run_as_script(name, folder, env, file_timeout, started)
    state = _outcomes(_read_log(log))
    for nodeid, why in hung:
        state[nodeid] = (why, (f"hang (no progress for {stall:g} s): " if why == "hang" else
                               f"slow (still working after {test_timeout:g} s): ") + stacks_of.get(nodeid, "?"))
    tests = [{"name": nodeid.split("::")[-1], "outcome": o, "cause": c} for nodeid, (o, c) in state.items()]
    result = {"file": name, "seconds": round(time.monotonic() - started), "tests": tests}
    with open(os.path.join(folder, "output0.txt"), errors="replace") as f:
        found = re.search(r"collected (\d+) item", f.read())
    result["collected"] = int(found.group(1)) if found else None
    if collect_error:
        result["collect_error"] = collect_error
    return result


def _unittest_outcomes(text: str) -> list:
    """Each test's outcome from unittest's verbose output (a rank's output may split a test's line)."""
    tests, current = [], None
    for line in text.splitlines():       # "test_x (module.Class.test_x) ... ok", the status maybe lines later
        found = re.match(r"(test\w+) \([^)]*\) \.\.\. ?(.*)$", line)
        if found:
            current, line = found.group(1), found.group(2)
        status = re.search(r"(?:^|\.\.\. )(ok|FAIL|ERROR|skipped.*)$", line.strip())
        if current and status:
            tests.append({"name": current, "outcome": {"ok": "passed", "FAIL": "failed", "ERROR": "error"}.get(
                status.group(1), "skipped"), "cause": ""})
            current = None
    for test in tests:
        if test["outcome"] in ("failed", "error"):
            block = re.search(r"^(?:FAIL|ERROR): " + test["name"] + r"\b.*?\n-{20,}\n(.*?)(?:\n={20,}|\n-{20,}|\Z)",
                              text, re.S | re.M)
            test["cause"] = _cause(block.group(1).strip().splitlines()[-1]) if block else "?"
    return tests


def _run_as_script(name: str, folder: str, env: dict, timeout: float, started: float) -> dict:
    """A file pytest cannot collect (a unittest.TestCase whose __init__ wants its method name, run by
    upstream as ``python file.py``): run it so, under ``pytest-npugraph run --devices 8`` (the plugin's
    script runner), and read unittest's verbose lines."""
    command = [sys.executable, "-m", "pytest_npugraph", "run", "--devices", "8", "--timeout", str(int(timeout)),
               name + ".py", "-v"]
    path = os.path.join(folder, "script.txt")
    with open(path, "w") as out:
        proc = subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with open(path, errors="replace") as f:
        text = f.read()
    tests = _unittest_outcomes(text)
    hazards = re.search(r"npugraph found (\d+) hazard", text)
    return {"file": name, "seconds": round(time.monotonic() - started), "tests": tests, "collected": len(tests),
            "script": True, "hazards": int(hazards.group(1)) if hazards else 0, "exit": proc.returncode}


def _innermost(text: str) -> str:
    """The innermost frame of a faulthandler dump's first thread: "file.py:function"."""
    for line in text.splitlines():
        found = re.match(r'\s+File "([^"]+)", line \d+ in (\S+)', line)
        if found:
            return f"{os.path.basename(found.group(1))}:{found.group(2)}"
    return "?"


def _stacks(folder: str, pytest_pid: int) -> str:
    """Where the test process and its rank processes waited when the hang was ended."""
    parent, ranks = "?", []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        with open(os.path.join(folder, name), errors="replace") as f:
            text = f.read()
        if not text.strip():
            continue
        blocks = [b for b in text.split("\n\n") if "File " in b]
        main = next((b for b in blocks if b.lstrip().startswith("Current thread")), blocks[-1] if blocks else "")
        where = _innermost(main)
        if name == f"{pytest_pid}.txt":
            parent = where
        else:
            ranks.append(where)
    return f"test process in {parent}; {len(ranks)} other process(es) in {', '.join(sorted(set(ranks))) or '-'}"


def _cause(text: str) -> str:
    """The first line naming an exception, without addresses and numbers that vary."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = next((x for x in lines if re.search(r"(Error|Exception|assert|Timeout|Hang)", x)), lines[0] if lines else "")
    return re.sub(r"0x[0-9a-f]+|\d+", "N", line)[:160]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", required=True, help="a checkout of github:Ascend/pytorch or its git directory")
    parser.add_argument("--ref", default="HEAD", help="the commit to read from a git directory (default HEAD)")
    parser.add_argument("--files", nargs="*", default=list(FILES))
    parser.add_argument("--test-timeout", type=float, default=1200.0,
                        help="seconds a test may run before it counts as a hang (default 1200)")
    parser.add_argument("--stall", type=float, default=90.0,
                        help="seconds without progress (no process started or ended, under 1 s of CPU) that make "
                             "a running test a hang (default 90)")
    parser.add_argument("--file-timeout", type=float, default=3600.0, help="seconds per file (default 3600)")
    parser.add_argument("--out", default=None, help="write the results as JSON")
    parser.add_argument("--cann", default="", help="the CANN version emulated (--npu-cann; default: the plugin's)")
    parser.add_argument("--keep", default=None, help="run in this folder and keep it (outputs, test logs)")
    options = parser.parse_args(argv)
    scratch = options.keep or tempfile.mkdtemp(prefix="npugraph-upstream-")
    files = sources(options.repo, options.ref)
    results = []
    for name in options.files:
        result = run_file(files, name, options.test_timeout, options.stall, options.file_timeout, scratch,
                          options.cann)
        counts = collections.Counter(t["outcome"] for t in result["tests"])
        state = "collect error" if "collect_error" in result else ""
        unrun = (result["collected"] or 0) - len(result["tests"])
        print(f"{name:<32} {counts['passed']:>3} passed {counts['failed']:>3} failed {counts['error']:>3} errors "
              f"{counts['skipped']:>3} skipped {counts['hang']:>2} hung {counts['slow']:>2} slow {unrun:>2} not run "
              f"{result['seconds']:>5} s {state}", flush=True)
        results.append(result)
        if options.out:
            with open(options.out, "w") as f:
                json.dump(results, f, indent=1)
    totals = collections.Counter(t["outcome"] for r in results for t in r["tests"])
    print(f"\n{len(results)} files: {totals['passed']} passed, {totals['failed']} failed, {totals['error']} errors, "
          f"{totals['skipped']} skipped, {totals['slow']} slow, {totals['hang']} hung (in {sum(any(t['outcome'] == 'hang' for t in r['tests']) for r in results)} files); "
          f"{sum('collect_error' in r for r in results)} files do not collect")
    causes = collections.Counter(t["cause"] for r in results for t in r["tests"]
                                 if t["outcome"] in ("failed", "error", "hang", "slow"))
    causes.update(r["collect_error"] for r in results if "collect_error" in r)
    for cause, n in causes.most_common():
        print(f"{n:>4}  {cause}")
    if not options.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
