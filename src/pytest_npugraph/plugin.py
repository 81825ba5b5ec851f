"""pytest-npugraph's pytest plugin (entry point ``npugraph``).

Loading it imports neither torch nor networkx: the emulated runtime is imported only when user
code imports ``torch_npu``/``torchair`` or requests the ``npugraph`` fixture.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings

import pytest

from . import activation, cann, inherit
from ._context import CONTEXT
from .chips import CHIPS, DEFAULT_CHIP, lookup
from .hazard import NpuHazardWarning
from .markers import MARKERS, MarkerError, config_for
from .outcome import HazardOutcome

_EMULATE = ("auto", "on", "off")
_HAZARDS = ("error", "warn", "off")
_SCHEDULES = ("program", "shuffle")
STASH_OUTCOME = pytest.StashKey()      # config.stash: the HazardOutcome plugin of this session
STASH_SAVED = pytest.StashKey()        # config.stash: the CONTEXT fields to give back at unconfigure
STASH_MODULES = pytest.StashKey()
STASH_SCHEDULE = pytest.StashKey()     # config.stash: (schedule, seed) of this session
STASH_NPU_SMI = pytest.StashKey()      # config.stash: the session's emulated npu-smi (npu_smi.Installed)
STASH_CANN = pytest.StashKey()         # config.stash: the session's default CANN version


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    group = parser.getgroup("npugraph", "Ascend NPU emulation and hazard checks (pytest-npugraph)")
    group.addoption("--npu-emulate", choices=_EMULATE, default=None,
                    help="emulate torch_npu/torchair on the CPU: on, off, or auto (on unless a real torch_npu is "
                         "installed). ini: npu_emulate")
    group.addoption("--npu-chip", default=None, metavar="NAME",
                    help=f"default chip profile of emulated devices ({', '.join(CHIPS)}). ini: npu_chip")
    group.addoption("--npu-cann", default=None, metavar="VERSION",
                    help=f"CANN release the emulation follows ({', '.join(cann.VERSIONS)}; default {cann.DEFAULT}): "
                         "HCCL AIV op table, static kernel + core limit. ini: npu_cann")
    group.addoption("--npu-hazards", choices=_HAZARDS, default=None,
                    help="what a hazard does to its test: error (fail, default), warn (NpuHazardWarning), "
                         "off (record only). ini: npu_hazards")
    group.addoption("--npu-trace-dir", default=None, metavar="DIR",
                    help="write each NPU-using test's timeline to DIR as Chrome-trace JSON (Perfetto, "
                         "chrome://tracing), named from its nodeid. ini: npu_trace_dir")
    group.addoption("--npu-html", default=None, metavar="PATH",
                    help="write a self-contained HTML report (each test's timeline and hazards) to PATH. "
                         "ini: npu_html")
    group.addoption("--npu-schedule", choices=_SCHEDULES, default=None,
                    help="when emulated device work runs: program (issue order where nothing waits) or shuffle "
                         "(work of different streams in another legal order, by --npu-schedule-seed, so racy code "
                         "computes other numbers). ini: npu_schedule")
    group.addoption("--npu-schedule-seed", type=int, default=None, metavar="N",
                    help="seed of --npu-schedule=shuffle (default: a random one, shown in the header). "
                         "ini: npu_schedule_seed")
    parser.addini("npu_emulate", "default for --npu-emulate (auto, on, off)", default="auto")
    parser.addini("npu_schedule", "default for --npu-schedule (program, shuffle)", default="program")
    parser.addini("npu_schedule_seed", "default for --npu-schedule-seed", default="")
    parser.addini("npu_chip", "default for --npu-chip", default=DEFAULT_CHIP)
    parser.addini("npu_cann", "default for --npu-cann", default=cann.DEFAULT)
    parser.addini("npu_hazards", "default for --npu-hazards (error, warn, off)", default="error")
    parser.addini("npu_trace_dir", "default for --npu-trace-dir", default="")
    parser.addini("npu_html", "default for --npu-html", default="")


def _setting(config, name: str, choices=None) -> str:
    # before pytest_configure (initial conftests) only known_args_namespace holds the options
    value = getattr(config.known_args_namespace, name, None) or config.getoption(name)
    if value is None:
        value = config.getini(name)
    value = str(value).strip()
    if choices is not None and value not in choices:
        raise pytest.UsageError(f"npugraph: ini option {name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _emulation_wanted(config) -> bool:
    mode = _setting(config, "npu_emulate", _EMULATE)
    return mode == "on" or (mode == "auto" and not activation.real_torch_npu_installed())


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Activate before conftest.py files are imported, so their ``import torch_npu`` is emulated."""
    if CONTEXT.child:       # pytest run by a test in a subprocess: its own options decide, not the parent's
        from . import child

        child.stop()
    try:
        wanted = _emulation_wanted(early_config)
    except (ValueError, pytest.UsageError):
        return  # reported again, properly, from pytest_configure
    if wanted:
        activation.activate()
        CONTEXT.emulating = True
        _install_npu_smi(early_config)   # conftests probe `npu-smi info` at import (vLLM-Ascend's does)


def _install_npu_smi(config) -> None:
    if config.stash.get(STASH_NPU_SMI, None) is None:
        from .npu_smi import Installed

        try:
            chip = _setting(config, "npu_chip")
        except (ValueError, pytest.UsageError):
            chip = DEFAULT_CHIP
        config.stash[STASH_NPU_SMI] = Installed(chip if chip in CHIPS else DEFAULT_CHIP)


def pytest_plugin_registered(plugin, manager):
    """After each conftest.py is imported: has it put a stub over the emulated torch_npu? (mock_guard)"""
    path = getattr(plugin, "__file__", None)
    if not CONTEXT.emulating or not path or os.path.basename(path) != "conftest.py":
        return
    from . import mock_guard

    names = mock_guard.swapped()
    if names and not getattr(manager, "_npugraph_stub_reported", False):
        manager._npugraph_stub_reported = True       # once per session
        raise pytest.UsageError(mock_guard.message(path, names, CONTEXT.rootdir or os.getcwd()))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test module that stubs torch_npu / torch.npu when imported (vLLM-Ascend's kv_offload tests do,
    unconditionally) would leave the stub for every later test: the stub is undone once the module is
    imported, with a warning naming its lines, so its tests and all later ones run on the emulation."""
    if not CONTEXT.emulating or not isinstance(collector, pytest.Module):
        return (yield)
    state = activation.snapshot()
    try:
        return (yield)
    finally:
        from . import mock_guard

        changed = mock_guard.undo(state)
        if changed:
            warnings.warn(NpuHazardWarning(mock_guard.module_message(str(collector.path), changed,
                                                                     CONTEXT.rootdir or os.getcwd())))


def pytest_configure(config):
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", help_text)
    chip = _setting(config, "npu_chip")
    if chip not in CHIPS:
        raise pytest.UsageError(f"npugraph: --npu-chip / npu_chip: unknown chip {chip!r}; known chips: "
                                f"{', '.join(CHIPS)}")
    version = _setting(config, "npu_cann")
    if version not in cann.VERSIONS:
        raise pytest.UsageError(f"npugraph: --npu-cann / npu_cann: unknown CANN version {version!r}; known "
                                f"versions: {', '.join(cann.VERSIONS)}")
    config.stash[STASH_CANN] = version
    hazards = _setting(config, "npu_hazards", _HAZARDS)
    config.stash[STASH_SCHEDULE] = (_setting(config, "npu_schedule", _SCHEDULES), _schedule_seed(config))
    emulating = _emulation_wanted(config)
    if emulating:
        activation.activate()
    config.stash[STASH_SAVED] = (CONTEXT.emulating, CONTEXT.hook, CONTEXT.rootdir)
    CONTEXT.emulating = emulating
    if emulating:
        _install_npu_smi(config)
    CONTEXT.hook = config.hook
    CONTEXT.rootdir = str(config.rootpath)
    outcome = config.stash[STASH_OUTCOME] = HazardOutcome(config, chip, hazards)
    config.pluginmanager.register(outcome, "npugraph-outcome")
    trace_dir, html_path = _path_setting(config, "npu_trace_dir"), _path_setting(config, "npu_html")
    if trace_dir or html_path:
        from .report.export import Export   # no torch, no networkx

        outcome.export = Export(config, trace_dir, html_path, _header(outcome, version))
        config.pluginmanager.register(outcome.export, "npugraph-export")


def _schedule_seed(config) -> int:
    """--npu-schedule-seed, else the ini's, else the controller's (xdist), else a fresh random one."""
    value = config.getoption("npu_schedule_seed")
    if value is None:
        text = str(config.getini("npu_schedule_seed")).strip()
        if text:
            try:
                value = int(text)
            except ValueError:
                raise pytest.UsageError(f"npugraph: ini option npu_schedule_seed must be an int, got {text!r}")
    if value is None:
        value = getattr(config, "workerinput", {}).get("npugraph_schedule_seed")
    if value is None:
        import random

        value = random.Random().getrandbits(32)
    return int(value)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: every worker shuffles with the controller's seed."""
    schedule = node.config.stash.get(STASH_SCHEDULE, None)
    if schedule is not None:
        node.workerinput["npugraph_schedule_seed"] = schedule[1]


def _path_setting(config, name: str):
    """A path option: the command line's relative to the invocation directory, the ini's to the rootdir."""
    value = config.getoption(name)
    if value:
        return str(config.invocation_params.dir / value)
    value = str(config.getini(name)).strip()
    return str(config.rootpath / value) if value else None


def pytest_unconfigure(config):
    """Give the context back (an in-process pytester session runs inside another one)."""
    npu_smi = config.stash.get(STASH_NPU_SMI, None)
    if npu_smi is not None:
        npu_smi.remove()
        del config.stash[STASH_NPU_SMI]
    saved = config.stash.get(STASH_SAVED, None)
    if saved is not None:
        CONTEXT.emulating, CONTEXT.hook, CONTEXT.rootdir = saved


def pytest_report_header(config):
    outcome = config.stash.get(STASH_OUTCOME, None)
    if outcome is None:
        return None
    if not CONTEXT.emulating:
        return "npugraph: NPU emulation off"
    lines = [_header(outcome, config.stash[STASH_CANN]), "npugraph: 1 emulated device per test (@pytest.mark.npu_devices(N) for more)"]
    schedule, seed = config.stash[STASH_SCHEDULE]
    lines.append(f"npugraph: schedule {schedule}" + (f" (--npu-schedule-seed={seed})" if schedule == "shuffle" else ""))
    export = outcome.export
    if export is not None:
        lines += [f"npugraph: {what} {path}" for what, path in
                  (("Chrome traces to", export.trace_dir), ("HTML report to", export.html_path)) if path]
    return lines


def _header(outcome, version: str) -> str:
    chip = lookup(outcome.chip)
    return (f"npugraph: NPU emulation {'on' if CONTEXT.emulating else 'off'} ({chip.name}: {chip.cube_cores} cube / "
            f"{chip.vector_cores} vector cores, {chip.hbm_bytes >> 30} GiB per device; CANN {version}), "
            f"hazards: {outcome.mode}")


def pytest_collection_modifyitems(session, config, items):
    errors = []
    chip = config.stash[STASH_OUTCOME].chip
    for item in items:
        try:
            config_for(item, chip, config.stash[STASH_CANN])
        except MarkerError as exc:
            errors.append(f"{item.nodeid}: {exc}")
    if errors:
        raise pytest.UsageError("npugraph: malformed markers:\n  " + "\n  ".join(errors))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Fresh emulated state for every test (built lazily when the test first touches the NPU)."""
    if not CONTEXT.emulating:
        return
    schedule, seed = item.config.stash[STASH_SCHEDULE]
    test_config = dataclasses.replace(
        config_for(item, item.config.stash[STASH_OUTCOME].chip, item.config.stash[STASH_CANN]),
        schedule=schedule, schedule_seed=seed, rank_skew=seed if schedule == "shuffle" else None)
    CONTEXT.begin(test_config, item.ihook)
    npu_smi = item.config.stash.get(STASH_NPU_SMI, None)
    if npu_smi is not None:
        npu_smi.set(test_config.chip.name, test_config.device_count)
    item.stash[STASH_MODULES] = activation.snapshot()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """After the test body: turn its hazards into the outcome (or, if it failed, a report section).
    During it, the Python processes it starts emulate its NPU and hand back their traces (inherit.py)."""
    children = contextlib.nullcontext()
    if CONTEXT.emulating and item.get_closest_marker("npu_no_inherit") is None:
        # no implementation of the op profile hook: no answers to hand down (a child asks its conftests, none)
        ask = CONTEXT.op_profile if CONTEXT.op_profile_answered() else None
        children = inherit.Inheritance(CONTEXT.config, ask, inherit.conftest_files(item))
    with children:
        try:
            result = yield
        except BaseException:
            if CONTEXT.emulating:
                item.config.stash[STASH_OUTCOME].check(item, failed=True)
            raise
        if CONTEXT.emulating:
            item.config.stash[STASH_OUTCOME].check(item)
        return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A compile error raised for the user's model shows the user's frames, not Dynamo's, AOTAutograd's
    and the emulated compiler's (the message names the user's line and the fix)."""
    if call.excinfo is not None and CONTEXT.emulating:
        _user_frames_of_compile_error(call.excinfo)
    return (yield)


def _user_frames_of_compile_error(excinfo) -> None:
    """Drop torch's and the plugin's frames from a ``BackendCompilerFailed`` traceback: the exception
    gets a traceback of the other frames (pytest re-reads the raw chain, so filtering its entries is
    not enough)."""
    if type(excinfo.value).__name__ != "BackendCompilerFailed" or "torch" not in sys.modules:
        return
    import os
    import types

    internal = (os.path.dirname(sys.modules["torch"].__file__) + os.sep, os.path.dirname(__file__) + os.sep)
    kept = [entry._rawentry for entry in excinfo.traceback if not str(entry.path).startswith(internal)]
    if not kept or len(kept) == len(excinfo.traceback):
        return
    tb = None
    for raw in reversed(kept):
        tb = types.TracebackType(tb, raw.tb_frame, raw.tb_lasti, raw.tb_lineno)
    excinfo.value.__traceback__ = tb
    excinfo._excinfo = (excinfo.type, excinfo.value, tb)
    excinfo.traceback = excinfo.traceback.__class__(tb)


def _fresh_dynamo() -> None:
    """Fresh compiled-graph caches in every test (docs/reference.md, "The npugraph fixture"): forget what Dynamo compiled in this test.  Its caches
    are per code object and outlive the test, so the 9th test compiling the same model class would
    otherwise hit the recompile limit (``FailOnRecompileLimitHit`` under ``fullgraph=True``), and the
    compiled graphs would keep the test's tensors and runtime alive."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    if convert_frame is not None and getattr(convert_frame, "FRAME_COUNTER", 0):
        sys.modules["torch._dynamo"].reset()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if CONTEXT.emulating:
        _fresh_dynamo()
    npu_smi = item.config.stash.get(STASH_NPU_SMI, None)
    if npu_smi is not None:
        npu_smi.reset()
    state = item.stash.get(STASH_MODULES, None)
    if state is not None:
        changed = activation.restore(state)
        if changed:
            warnings.warn(NpuHazardWarning(
                f"npugraph: {item.nodeid} replaced {', '.join(map(str, changed))}; restored the emulated "
                f"versions so later tests are not affected"))


@pytest.fixture
def npugraph(request):
    """The emulated NPU runtime and hazard checker of this test (fresh per test).

    ``npugraph.expect(kind, match=None)`` (a block must produce that hazard), ``npugraph.assert_clean()``,
    ``npugraph.hazards``, ``npugraph.run_ranks(fn, *args)`` (one call per emulated device, with
    ``torch.distributed``), ``npugraph.timeline(path)``, ``npugraph.graphs``, ``npugraph.trace``,
    ``npugraph.chip`` / ``cube_cores`` / ``vector_cores`` / ``device_count``.
    Reference: docs/reference.md, section "The npugraph fixture"."""
    if not CONTEXT.emulating:
        pytest.skip("npugraph: NPU emulation is off (--npu-emulate=off, or a real torch_npu is installed "
                    "and --npu-emulate=auto)")
    from .fixture import NpuGraph

    return NpuGraph(request.node, request.config.stash[STASH_OUTCOME])
