"""``pytest-npugraph run SCRIPT [args]`` (also ``python -m pytest_npugraph run ...``): a plain script
under the emulated NPU, with the hazard report at exit (issue 28).

Why: seed documents, TorchAir's samples and many users' checks are scripts, not tests.  The script
runs as a child of this command exactly as a subprocess of a test does (inherit.py: the emulated
``torch_npu``/``torchair``/``npugraph_ex`` with the chosen chip, devices, cores and schedule; its
subprocesses and ``multiprocessing`` children too), its trace and theirs come back here, the analyses
run on them together, and the report goes to stderr.  Exit status: the script's, else 1 when a
hazard fails (``--npu-hazards error``, the default), else 0.

``--nproc-per-node N`` starts N copies with ``torchrun``'s environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``): a multi-rank script whose ranks meet in
``init_process_group("hccl")`` (runtime/collectives/processes.py); ``--devices`` defaults to N then.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from typing import Optional

from .chips import CHIPS, DEFAULT_CHIP, lookup

USAGE = "pytest-npugraph run [options] SCRIPT [ARGS...]"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pytest-npugraph", description="Run a script under the emulated Ascend NPU "
                                     "and report the hazards its device work has.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", usage=USAGE, help="run a Python script under the emulator")
    run.add_argument("--npu-chip", "--chip", dest="chip", default=DEFAULT_CHIP, choices=sorted(CHIPS),
                     metavar="NAME", help=f"chip profile (default {DEFAULT_CHIP})")
    run.add_argument("--devices", type=int, default=None, metavar="N",
                     help="emulated NPUs (default 1, or --nproc-per-node)")
    run.add_argument("--cores", default=None, metavar="AICORE[,VECTOR]",
                     help="cube and vector cores per device (vector defaults to 2 x aicore)")
    run.add_argument("--npu-cann", "--cann", dest="cann", default=None, metavar="VERSION",
                     help="the CANN release emulated (as the plugin's --npu-cann)")
    run.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                     help="start N ranks with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT)")
    run.add_argument("--npu-schedule", "--schedule", dest="schedule", choices=("program", "shuffle"),
                     default="program", help="when device work runs (as the plugin's --npu-schedule)")
    run.add_argument("--npu-schedule-seed", "--schedule-seed", dest="seed", type=int, default=None, metavar="N")
    run.add_argument("--npu-hazards", "--hazards", dest="hazards", choices=("error", "warn", "off"),
                     default="error", help="error: a hazard makes the exit status 1 (default); warn: report only; "
                                           "off: no report")
    run.add_argument("--npu-allow", "--allow", dest="allow", action="append", default=[], metavar="KIND",
                     help="hazards of KIND are reported but do not fail (repeatable)")
    run.add_argument("--npu-html", "--html", dest="html", default=None, metavar="PATH",
                     help="write the HTML report (timeline and hazards) to PATH")
    run.add_argument("--npu-trace", "--trace", dest="trace", default=None, metavar="PATH",
                     help="write the timeline as Chrome-trace JSON to PATH")
    run.add_argument("--conftest", action="append", default=[], metavar="PATH",
                     help="a conftest.py whose pytest_npugraph_op_profile / register_ops hooks apply (repeatable)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                     help="end the script's processes after this long (default 600)")
    run.add_argument("script", metavar="SCRIPT")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    return parser


def _config(options):
    from ._context import TestConfig
    from .hazard import KINDS

    chip = lookup(options.chip)
    if options.cores:
        parts = options.cores.split(",")
        try:
            cube = int(parts[0])
            vector = int(parts[1]) if len(parts) > 1 else 2 * cube
        except ValueError:
            raise SystemExit(f"pytest-npugraph: --cores takes AICORE[,VECTOR], got {options.cores!r}") from None
        chip = chip.with_cores(cube, vector)
    for kind in options.allow:
        if kind not in KINDS:
            raise SystemExit(f"pytest-npugraph: --allow: unknown hazard kind {kind!r}; kinds: {', '.join(KINDS)}")
    devices = options.devices if options.devices is not None else max(1, options.nproc_per_node)
    if devices < 1 or options.nproc_per_node < 1:
        raise SystemExit("pytest-npugraph: --devices and --nproc-per-node take a positive int")
    seed = options.seed
    if seed is None:
        import random

        seed = random.Random().getrandbits(32)
    extra = {}
    if options.cann is not None:
        from . import cann

        if options.cann not in cann.VERSIONS:
            raise SystemExit(f"pytest-npugraph: --cann: unknown CANN version {options.cann!r}; known versions: "
                             f"{', '.join(cann.VERSIONS)}")
        extra["cann"] = options.cann
    return TestConfig(chip=chip, device_count=devices, allow=frozenset(options.allow),
                      nodeid=os.path.basename(options.script), schedule=options.schedule, schedule_seed=seed, **extra)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(options, config) -> int:
    """Start the script's processes (children of this command) and wait for them; their exit status."""
    n = options.nproc_per_node
    env = dict(os.environ)
    if n > 1:
        env.update({"WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(_free_port()), "GROUP_RANK": "0"})
    procs = []
    for rank in range(n):
        if n > 1:
            env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, options.script] + list(options.args), env=env))
    deadline = time.monotonic() + options.timeout
    codes = []
    for rank, proc in enumerate(procs):
        try:
            codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            print(f"pytest-npugraph: {options.script} still running after {options.timeout:g} s: ended it "
                  f"(--timeout)", file=sys.stderr)
            return 124
    return next((c for c in codes if c), 0)


def run(options) -> int:
    from . import activation, child, inherit
    from ._context import CONTEXT
    from .outcome import format_report

    if not os.path.isfile(options.script):
        print(f"pytest-npugraph: {options.script}: no such file", file=sys.stderr)
        return 2
    config = _config(options)
    activation.activate()
    CONTEXT.emulating = True
    CONTEXT.hook = child.ChildHook({}, [os.path.abspath(p) for p in options.conftest])
    CONTEXT.begin(config, None)
    chip = config.chip
    print(f"npugraph: NPU emulation on ({chip.name}: {chip.cube_cores} cube / {chip.vector_cores} vector cores, "
          f"{config.device_count} device(s)), schedule {config.schedule}"
          + (f" (seed {config.schedule_seed})" if config.schedule == "shuffle" else "")
          + f", CANN {config.cann}" + (f", {options.nproc_per_node} ranks" if options.nproc_per_node > 1 else ""),
          file=sys.stderr)
    with inherit.Inheritance(config, CONTEXT.op_profile, [os.path.abspath(p) for p in options.conftest]) as children:
        code = _ranks(options, config)
        hazards, trace = _analyze(children)
    failing = [h for h in hazards if h.severity != "warning" and h.kind not in config.allow]
    if options.hazards != "off":
        if hazards:
            print("\n" + format_report(hazards), file=sys.stderr)
        elif trace is not None:
            print("npugraph: no hazards", file=sys.stderr)
    if trace is not None:
        _export(options, trace, hazards, config)
    if code:
        return code
    return 1 if failing and options.hazards == "error" else 0


def _analyze(children) -> tuple:
    """The hazards of the children's traces together, and that trace (None: nothing used the NPU)."""
    from . import inherit

    if not inherit.absorb(children):
        return [], None
    from .analysis import analyze
    from .runtime.runtime import current

    rt = current()
    trace = rt.trace.with_records(rt.trace.records[:])
    seen, out = set(), []
    for h in analyze(trace):
        if h.key not in seen:
            seen.add(h.key)
            out.append(h)
    return out, trace


def _export(options, trace, hazards, config) -> None:
    status = {h.key: ("allowed" if h.kind in config.allow else "warning" if h.severity == "warning"
                      else "failed") for h in hazards}
    if options.trace:
        from .report import timeline

        timeline.write(options.trace, trace, hazards, status)
        print(f"npugraph: Chrome trace {options.trace}", file=sys.stderr)
    if options.html:
        import json

        from .report import html
        from .report.timeline import chrome_trace

        entry = {"nodeid": config.nodeid, "outcome": "passed", "duration": 0.0,
                 "timeline": json.dumps(chrome_trace(trace, hazards, status))}
        with open(options.html, "w", encoding="utf-8") as f:
            f.write(html.render([entry], f"npugraph run {config.nodeid} ({config.chip.name})"))
        print(f"npugraph: HTML report {options.html}", file=sys.stderr)


def main(argv: Optional[list] = None) -> int:
    options = _parser().parse_args(argv)
    if options.command == "run":
        return run(options)
    return 2

