"""The upstream yardstick of issue 28: torch_npu's own multi-process distributed tests under the plugin.

Why: they are written for real cards (``torch.multiprocessing`` spawn of one process per rank,
``init_process_group("hccl")`` over ``env://``, queues back to the parent) with torch_npu's public API,
so how many pass under the emulator measures how far "ranks as processes" carries real suites.

Usage (a checkout of github:Ascend/pytorch, e.g. the ``fetch`` mirror, at ``--repo``)::

    python tools/upstream_distributed.py --repo /path/to/Ascend-pytorch [--files test_allreduce ...]
        [--timeout 900] [--out results.json]

Each file runs in its own ``python -m pytest -p no:randomly -p no:cacheprovider`` (the plugin emulates
``torch_npu``; the file is copied into a scratch folder so the checkout's conftest/pytest.ini stay out)
with a per-file timeout (a file that hangs counts as ``hang`` and is ended) and 8 emulated devices (a
``conftest.py`` beside the copy marks every test ``npu_devices(8)``, as a machine of 8 cards).  Each test's outcome is read
from a JUnit XML report and sorted by the first line of its failure (the cause), and the totals are
printed: passed / failed / errors / skipped per file, then the causes by count.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

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


CONFTEST = """
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.npu_devices(8))
"""


def run_file(repo: str, name: str, timeout: float, scratch: str) -> dict:
    source = os.path.join(repo, "test", "distributed", name + ".py")
    folder = os.path.join(scratch, name)
    os.makedirs(folder, exist_ok=True)
    shutil.copy(source, folder)
    with open(os.path.join(folder, "conftest.py"), "w") as f:      # the cards the tests ask for
        f.write(CONFTEST)
    report = os.path.join(folder, "junit.xml")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
               f"--junitxml={report}", "--rootdir", folder, os.path.join(folder, name + ".py")]
    env = dict(os.environ, NPUGRAPH_COLLECTIVE_TIMEOUT=os.environ.get("NPUGRAPH_COLLECTIVE_TIMEOUT", "60"))
    proc = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)          # the file's pytest and the rank processes it started
        output, _ = proc.communicate()
        hung = True
    result = {"file": name, "hang": hung, "tests": []}
    if os.path.exists(report):
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome, cause = "passed", ""
            for kind in ("failure", "error", "skipped"):
                node = case.find(kind)
                if node is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                    cause = _cause(node.get("message") or node.text or "")
                    break
            result["tests"].append({"name": case.get("name"), "outcome": outcome, "cause": cause})
    elif not hung:
        result["collect_error"] = _cause(output[-2000:])
    return result


def _cause(text: str) -> str:
    """The first line naming an exception, without addresses and numbers that vary."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = next((x for x in lines if re.search(r"(Error|Exception|assert|Timeout)", x)), lines[0] if lines else "")
    return re.sub(r"0x[0-9a-f]+|\d+", "N", line)[:160]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", required=True, help="a checkout of github:Ascend/pytorch")
    parser.add_argument("--files", nargs="*", default=list(FILES))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per file (default 900)")
    parser.add_argument("--out", default=None, help="write the results as JSON")
    options = parser.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="npugraph-upstream-")
    results = []
    for name in options.files:
        result = run_file(options.repo, name, options.timeout, scratch)
        counts = collections.Counter(t["outcome"] for t in result["tests"])
        state = "HANG" if result["hang"] else "collect error" if "collect_error" in result else ""
        print(f"{name:<36} {counts['passed']:>3} passed {counts['failed']:>3} failed {counts['error']:>3} errors "
              f"{counts['skipped']:>3} skipped {state}", flush=True)
        results.append(result)
    totals = collections.Counter(t["outcome"] for r in results for t in r["tests"])
    print(f"\n{len(results)} files: {totals['passed']} passed, {totals['failed']} failed, {totals['error']} errors, "
          f"{totals['skipped']} skipped; {sum(r['hang'] for r in results)} files hang, "
          f"{sum('collect_error' in r for r in results)} do not collect")
    causes = collections.Counter(t["cause"] for r in results for t in r["tests"] if t["outcome"] in ("failed", "error"))
    causes.update(r["collect_error"] for r in results if "collect_error" in r)
    for cause, n in causes.most_common():
        print(f"{n:>4}  {cause}")
    if options.out:
        with open(options.out, "w") as f:
            json.dump(results, f, indent=1)
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
