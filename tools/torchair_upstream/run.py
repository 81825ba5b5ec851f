#!/usr/bin/env python
"""TorchAir's upstream tests as a yardstick: run the files of ``files.txt`` from a checkout of
Ascend/torchair under pytest-npugraph and count the outcomes by cause.

    python tools/torchair_upstream/run.py --upstream /path/to/torchair [--default-device npu] [--keep DIR]
        [--details FILE] [--devices N] [--only PART] [--timeout SECONDS]

The upstream files are copied to a temporary folder (never into this repository) and run there with
``pytest -p no:randomly``, one pytest per file (a file that hangs or crashes costs only itself;
``--timeout`` seconds each).  ``--default-device npu`` adds a conftest that calls
``torch.set_default_device("npu")`` before each test, as users who set it do; ``--devices N`` gives
every test N emulated devices (as a machine with N NPUs; the plugin's default is 1).  The report is one line
per outcome cause: passed, and each failure's exception type with the first line of its message
(numbers and addresses folded), most frequent first."""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))

_CONFTEST_DEFAULT_DEVICE = '''
import pytest


@pytest.fixture(autouse=True)
def _default_device_npu():
    import torch
    import torch_npu  # noqa: F401

    torch.set_default_device("npu")
    yield
    torch.set_default_device(None)
'''

_CONFTEST_DEVICES = '''
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.npu_devices(%d))
'''


def listed_files() -> list:
    with open(os.path.join(HERE, "files.txt"), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def _cause(case) -> str | None:
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            text = (node.get("message") or node.text or "").strip().splitlines()
            first = text[0] if text else tag
            first = re.sub(r"0x[0-9a-f]+", "0x?", first)
            first = re.sub(r"\d+", "N", first)
            return first[:160]
    if case.find("skipped") is not None:
        return "skipped"
    return None


def _test_count(path: str) -> int:
    """How many tests a file defines (for a file that timed out or did not collect)."""
    with open(path, encoding="utf-8") as f:
        return len(re.findall(r"^\s+def test\w*\(", f.read(), flags=re.M))


def _run_file(cmd: list, folder: str, timeout: int) -> bool:
    """Run one file's pytest in its own process group; False if it ran out of time (the whole group,
    rank processes included, is killed then)."""
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def run(upstream: str, default_device: str | None, timeout: int, keep: str | None,
        details: list | None = None, devices: int | None = None, only: str | None = None) -> collections.Counter:
    work = keep or tempfile.mkdtemp(prefix="torchair_upstream_")
    os.makedirs(work, exist_ok=True)
    counts = collections.Counter()
    for rel in listed_files():
        if only and only not in rel:
            continue
        src = os.path.join(upstream, rel)
        if not os.path.exists(src):
            counts[f"missing file {rel}"] += 1
            continue
        folder = os.path.join(work, os.path.dirname(rel))
        os.makedirs(folder, exist_ok=True)
        for sibling in os.listdir(os.path.dirname(src)):       # helpers the tests import
            if sibling.endswith(".py"):
                shutil.copy(os.path.join(os.path.dirname(src), sibling), folder)
        conftest = os.path.join(folder, "conftest.py")
        text = (_CONFTEST_DEFAULT_DEVICE.replace('"npu"', repr(default_device)) if default_device else "") + \
            (_CONFTEST_DEVICES % devices if devices else "")
        if text:
            with open(conftest, "w", encoding="utf-8") as f:
                f.write(text)
        elif os.path.exists(conftest):
            os.remove(conftest)
        xml = os.path.join(work, rel.replace("/", "__") + ".xml")
        if os.path.exists(xml):
            os.remove(xml)
        cmd = [sys.executable, "-m", "pytest", os.path.basename(rel), "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
               f"--junitxml={xml}", "-o", "python_files=*.py"]
        if not _run_file(cmd, folder, timeout):
            counts[f"file timed out after {timeout}s: {rel}"] += _test_count(src)
            if details is not None:
                details.append((rel, "*", f"file timed out after {timeout}s"))
            continue
        if not os.path.exists(xml):
            counts[f"file did not run: {rel}"] += _test_count(src)
            continue
        cases = list(ET.parse(xml).getroot().iter("testcase"))
        if len(cases) == 1 and cases[0].get("classname") == "":      # the file did not collect
            error = cases[0].find("error")
            lines = [line[4:] for line in (error.text or "").splitlines() if line.startswith("E   ")] if error is not None \
                else []
            cause = f"collection: {lines[-1][:160] if lines else 'failed'}"
            counts[cause] += _test_count(src)
            if details is not None:
                details.append((rel, "*", cause))
            continue
        for case in cases:
            cause = _cause(case)
            counts["passed" if cause is None else cause] += 1
            if details is not None:
                details.append((rel, case.get("name"), "passed" if cause is None else cause))
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="a checkout of Ascend/torchair")
    parser.add_argument("--default-device", default=None, help='e.g. "npu": torch.set_default_device before each test')
    parser.add_argument("--timeout", type=int, default=900, help="seconds per file")
    parser.add_argument("--keep", default=None, help="run in this folder and keep it (junit xml per file)")
    parser.add_argument("--details", default=None, help="write one line per test (file, test, outcome) here")
    parser.add_argument("--devices", type=int, default=None,
                        help="emulated devices per test (@pytest.mark.npu_devices(N)); default: the plugin's 1")
    parser.add_argument("--only", default=None, help="run only the listed files whose path contains this")
    args = parser.parse_args()
    details = [] if args.details else None
    counts = run(args.upstream, args.default_device, args.timeout, args.keep, details, args.devices, args.only)
    if args.details:
        with open(args.details, "w", encoding="utf-8") as f:
            for row in details:
                f.write("\t".join(row) + "\n")
    total = sum(counts.values())
    print(f"passed {counts['passed']}/{total} (default device: {args.default_device or 'cpu'})")
    for cause, n in counts.most_common():
        if cause != "passed":
            print(f"{n:4d}  {cause}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
