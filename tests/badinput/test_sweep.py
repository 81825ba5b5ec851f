"""Every public emulated callable, called with wrong types and values: the error (if any) is raised
deliberately at the boundary, never from deep inside pytest-npugraph, and the test's analyses still
run cleanly afterwards (a bad argument must not reach the trace and crash an analysis at test end)."""
import threading

import pytest
import torch
import torch_npu  # noqa: F401
import torchair  # noqa: F401

from .sweep import BAD_VALUES, calls, internal_error, public_callables

CALLABLES = public_callables()
# calls that would legitimately block or spawn work outside the test's control
SKIP = {"torch_npu.distributed.ProcessGroupHCCL"}


def test_the_sweep_covers_the_public_surface():
    names = [n for n, _ in CALLABLES]
    assert len(names) > 80
    for expected in ("torch.npu.set_stream_limit", "torch.npu.set_device_limit", "torch.npu.Event",
                     "torch.npu.Stream", "torch.npu.ExternalStream", "torchair.get_npu_backend",
                     "torchair.scope.limit_core_num", "torchair.ops.npu_tagged_event_record"):
        assert expected in names


@pytest.mark.parametrize("name, fn", CALLABLES, ids=[n for n, _ in CALLABLES])
def test_bad_arguments_fail_at_the_boundary(npugraph, name, fn):
    if name in SKIP:
        pytest.skip("spawns a process group")
    problems = []
    for bad in BAD_VALUES:
        for args, kwargs in calls(fn, bad):
            try:
                result = fn(*args, **kwargs)
                if hasattr(result, "__enter__") and hasattr(result, "__exit__") and not isinstance(result, torch.Tensor):
                    with result:
                        pass
            except BaseException as exc:      # noqa: BLE001 - judged below
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                found = internal_error(exc)
                if found:
                    problems.append(f"{name}(*{args!r}, **{kwargs!r}): {found}")
    assert threading.active_count() < 50
    npugraph.assert_clean()       # raises the analysis error if a bad value reached the trace
    assert not problems, "\n".join(problems)


def test_methods_of_streams_events_graphs_and_the_fixture(npugraph, tmp_path, monkeypatch):
    """Every public method of Stream, Event, NPUGraph and the ``npugraph`` fixture, called with wrong
    types and values: no internal error, and the test's analyses still run cleanly.  (In a temporary
    directory: ``npugraph.timeline("x")`` writes a file.)"""
    from .sweep import public_methods

    monkeypatch.chdir(tmp_path)

    methods = public_methods(npugraph)
    names = [n for n, _ in methods]
    for expected in ("npugraph.expect", "npugraph.assert_clean", "npugraph.run_ranks", "npugraph.timeline",
                     "torch.npu.Stream().wait_stream", "torch.npu.Event().elapsed_time",
                     "torch.npu.NPUGraph().capture_begin"):
        assert expected in names
    problems = []
    for name, fn in methods:
        for bad in BAD_VALUES:
            for args, kwargs in calls(fn, bad):
                try:
                    result = fn(*args, **kwargs)
                    if hasattr(result, "__enter__") and hasattr(result, "__exit__"):
                        with result:
                            pass
                except BaseException as exc:      # noqa: BLE001 - judged below
                    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        raise
                    found = internal_error(exc)
                    if found:
                        problems.append(f"{name}(*{args!r}, **{kwargs!r}): {found}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("bad, exc, match", [
    ("nonsense", ValueError, r"npugraph\.expect: unknown hazard kind 'nonsense'; kinds: race, "),
    (5, ValueError, r"npugraph\.expect: unknown hazard kind 5"),
    (None, ValueError, r"unknown hazard kind None"),
])
def test_fixture_expect_rejects_unknown_kinds(npugraph, bad, exc, match):
    with pytest.raises(exc, match=match):
        with npugraph.expect(bad):
            pass
    with pytest.raises(exc, match=match.replace("expect", "assert_clean")):
        npugraph.assert_clean(bad)


def test_fixture_run_ranks_with_a_non_callable(npugraph):
    with pytest.raises(TypeError, match="npugraph.run_ranks: fn must be a callable taking the rank, got str"):
        npugraph.run_ranks("not a function")
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given"):
        npugraph.run_ranks(lambda rank: rank, "extra")
    assert npugraph.run_ranks(lambda rank: rank * 10) == [0]


def _config_cases():
    import npugraph_ex

    cases = []
    for owner, make in (("torchair", lambda: torchair.CompilerConfig()),
                        ("npugraph_ex", lambda: npugraph_ex.CompilerConfig())):
        for path, _, _ in sweep_config_leaves(make()):
            cases.append((f"{owner}:{path}", make))
    return cases


def sweep_config_leaves(config):
    from .sweep import config_leaves
    return config_leaves(config)


CONFIG_CASES = _config_cases()


def test_the_config_sweep_covers_every_option():
    paths = [p for p, _ in CONFIG_CASES]
    assert len(paths) > 60
    for expected in ("torchair:config.mode", "torchair:config.debug.aclgraph.clone_input",
                     "torchair:config.debug.aclgraph.disable_mempool_reuse_in_same_fx", "torchair:config.debug.graph_dump.type",
                     "npugraph_ex:config.capture_limit", "npugraph_ex:config.data_dump_dir"):
        assert expected in paths


@pytest.mark.parametrize("path, make", CONFIG_CASES, ids=[p for p, _ in CONFIG_CASES])
def test_config_setters_reject_bad_values_with_torchairs_errors(path, make):
    """Every CompilerConfig option (torchair and npugraph_ex), set to wrong types and values: either
    accepted (the option takes it) or refused at the assignment with the option class's exception type
    and text; the config stays usable."""
    import re

    from .sweep import OPTION_ERRORS, config_leaves

    config = make()
    leaf = {p: (group, name) for p, group, name in config_leaves(config)}[path.split(":", 1)[1]]
    group, name = leaf
    problems = []
    for bad in BAD_VALUES + ("", {"a": 1}, [1.5], True):
        try:
            setattr(group, name, bad)
        except (ValueError, TypeError, FileNotFoundError, OverflowError, AttributeError) as exc:
            text = str(exc).splitlines()[0]
            if not any(isinstance(exc, t) and re.search(m, text) for t, m in OPTION_ERRORS):
                problems.append(f"{path} = {bad!r}: {type(exc).__name__}: {text}")
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            problems.append(f"{path} = {bad!r}: unexpected {type(exc).__name__}: {exc}")
    if hasattr(config, "as_dict"):
        config.as_dict()
    assert not problems, "\n".join(problems)


def test_an_unknown_option_name_is_refused_with_the_option_list():
    config = torchair.CompilerConfig()
    with pytest.raises(ValueError, match=r"DebugConfig has no option nonsense, all options \["):
        config.debug.nonsense = 1
    with pytest.raises(ValueError, match=r"CompilerConfig has no option moed, all options \["):
        config.moed = "reduce-overhead"
