"""pytest plugin of the determinism harness (loaded with ``-p determinism_recorder`` in a child pytest).

Keeps the tests that call ``npugraph.run_ranks`` (multi-rank tests and examples), gives every rank
thread the skew of ``NPUGRAPH_DETERMINISM_SEED`` (runtime/skew.py; empty: none), and writes to
``NPUGRAPH_DETERMINISM_OUT`` one verdict per test: its outcome, its hazards (kind, status, text, as
the plugin lists them), and what each ``run_ranks`` call returned or raised.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os

import pytest

SEED = os.environ.get("NPUGRAPH_DETERMINISM_SEED", "")
OUT = os.environ["NPUGRAPH_DETERMINISM_OUT"] + (f".{os.environ['PYTEST_XDIST_WORKER']}"
                                                 if os.environ.get("PYTEST_XDIST_WORKER") else "")
VERDICTS: dict = {}
DURATIONS: dict = {}       # nodeid -> seconds (not part of the verdict)
CURRENT = [None]


def multi_rank(item) -> bool:
    fn = getattr(item, "obj", None)
    try:
        source = inspect.getsource(fn)
    except (TypeError, OSError):
        return False
    # (a test that installs skews itself would see the harness's too)
    return "run_ranks" in source and "processes=True" not in source and "skew.install" not in source


def pytest_configure(config):
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("npugraph-determinism", derandomize=True, database=None)
    settings.load_profile("npugraph-determinism")   # the same examples in every run


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    kept = [i for i in items if multi_rank(i)]
    dropped = [i for i in items if not multi_rank(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _digest(value):
    """A comparable, JSON-able picture of a run_ranks result."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return ["npu tensor", list(value.shape), str(value.dtype)]
        return ["tensor", list(value.shape), str(value.dtype), repr(value.detach().tolist())]
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_digest(v) for v in value]
    if isinstance(value, dict):
        return {repr(k): _digest(v) for k, v in value.items()}
    if value is None or isinstance(value, (int, str, bool)):
        return value
    return type(value).__name__


def _install():
    from pytest_npugraph.fixture import NpuGraph

    original = NpuGraph.run_ranks
    if getattr(original, "_determinism", False):
        return

    def run_ranks(self, fn, *args):
        calls = VERDICTS.setdefault(CURRENT[0], {}).setdefault("run_ranks", [])
        try:
            result = original(self, fn, *args)
        except BaseException as exc:
            calls.append(["raised", type(exc).__name__, str(exc)])
            raise
        calls.append(["returned", _digest(result)])
        return result

    run_ranks._determinism = True
    NpuGraph.run_ranks = run_ranks


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    CURRENT[0] = item.nodeid
    VERDICTS.setdefault(item.nodeid, {})


def pytest_runtest_setup(item):
    """After the npugraph plugin's own setup (tryfirst) chose the test's config: add the skew."""
    from pytest_npugraph._context import CONTEXT

    _install()
    if SEED:
        CONTEXT.config = dataclasses.replace(CONTEXT.config, rank_skew=int(SEED))


def pytest_runtest_logreport(report):
    verdict = VERDICTS.setdefault(report.nodeid, {})
    if report.when == "call" or report.outcome != "passed":
        verdict.setdefault("outcome", []).append([report.when, report.outcome])
    DURATIONS[report.nodeid] = DURATIONS.get(report.nodeid, 0.0) + report.duration
    if hasattr(report, "wasxfail"):
        verdict["xfail"] = report.wasxfail or "xfail"
    for name, value in report.user_properties:
        if name == "npugraph_hazards":
            verdict.setdefault("hazards", []).extend([list(h) for h in value])


def pytest_sessionfinish(session):
    if getattr(session.config, "workerinput", None) is None and session.config.pluginmanager.has_plugin("dsession"):
        return      # the xdist controller: its workers write the verdicts
    with open(OUT, "w") as f:
        json.dump(VERDICTS, f, indent=1, sort_keys=True)
    with open(OUT + ".durations", "w") as f:
        json.dump(DURATIONS, f, indent=1, sort_keys=True)
