"""vLLM-Ascend's tests/ut as a yardstick: run it with the plugin off (its own MagicMocks, as upstream
CI on a CPU runner does) and with the plugin on (the emulated ``npu-smi`` makes its conftest take the
NPU branch: no mocks), and compare.

    python tools/vllm_ascend_ut/run.py --venv VENV --src VLLM_ASCEND_CHECKOUT [--out DIR] [-k EXPR]

VENV is made by ``setup.sh VENV VLLM_ASCEND_CHECKOUT`` (vllm without dependencies, this checkout's
pytest-npugraph editable); VLLM_ASCEND_CHECKOUT holds ``tests/ut`` of the release under test
(v0.23.0).  Prints pass/fail/error/skip counts of both runs, failures of the plugin run grouped by
their first error line, and the median per-test time of the tests that pass in both runs.
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def run(venv: str, src: str, out: Path, plugin: bool, extra) -> Path:
    xml = out / ("on.xml" if plugin else "off.xml")
    args = [os.path.join(venv, "bin", "python"), "-m", "pytest", "tests/ut", "-q", "-p", "no:randomly",
            "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={xml}", "--timeout=120",
            "--continue-on-collection-errors"] + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if plugin:
        args += ["-p", "npugraph", "--npu-emulate=on", "--npu-hazards=error"]
    else:
        args += ["-p", "no:npugraph"]
    log = out / ("on.log" if plugin else "off.log")
    with open(log, "w") as f:
        subprocess.run(args, cwd=src, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=4 * 3600)
    return xml


def cases(xml: Path) -> dict:
    """nodeid -> (outcome, seconds, first message line)."""
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip().splitlines()[0:1]
                message = message[0] if message else ""
                break
        found[name] = (outcome, float(case.get("time") or 0.0), message)
    return found


def cause(message: str) -> str:
    """A failure message without its numbers, names in quotes and addresses: a cause to group by."""
    message = re.sub(r"0x[0-9a-f]+", "0x…", message)
    message = re.sub(r"\d+", "N", message)
    return message[:140]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--out", default="vllm_ascend_ut_results")
    p.add_argument("--only", choices=("on", "off"), help="run one mode (two can run side by side)")
    p.add_argument("--report-only", action="store_true", help="compare the XML files already in --out")
    a, extra = p.parse_known_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in ("off", "on"):
        if a.only in (None, mode) and not a.report_only:
            run(a.venv, a.src, out, mode == "on", extra)
        xml = out / f"{mode}.xml"
        if xml.exists():
            results[mode] = cases(xml)
    for mode, found in results.items():
        counts = collections.Counter(outcome for outcome, _, _ in found.values())
        print(f"plugin {mode:3s}: {len(found)} tests: " + ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped")))
    if "on" in results:
        causes = collections.Counter(cause(m) for o, _, m in results["on"].values() if o in ("failed", "error"))
        print("plugin on, failures and errors by cause:")
        for text, n in causes.most_common(40):
            print(f"  {n:5d}  {text}")
    if len(results) == 2:
        for a_mode, b_mode in (("off", "on"), ("on", "off")):
            moved = sorted(k for k, v in results[a_mode].items()
                           if v[0] == "passed" and results[b_mode].get(k, ("",))[0] in ("failed", "error"))
            print(f"{len(moved)} tests pass with the plugin {a_mode} and fail with it {b_mode}")
            if a_mode == "off":
                for k in moved[:60]:
                    print(f"  {k}: {cause(results[b_mode][k][2])}")
        both = [k for k in results["on"] if results["on"][k][0] == "passed" and results["off"].get(k, ("",))[0] == "passed"]
        if both:
            on = statistics.median(results["on"][k][1] for k in both)
            off = statistics.median(results["off"][k][1] for k in both)
            print(f"{len(both)} tests pass both ways: median per-test time {on * 1e3:.1f} ms with the plugin, "
                  f"{off * 1e3:.1f} ms without ({on / off if off else float('nan'):.2f}x)")


if __name__ == "__main__":
    main()
