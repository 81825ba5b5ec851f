"""``analyze``: runs the registry once per trace, filters kinds, tolerates missing modules."""
from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import types

import pytest

from pytest_npugraph import analysis
from pytest_npugraph.analysis import happens_before

from .tracebuild import Build


def buggy() -> Build:
    b = Build("main", "side")
    b.alloc("x", stream="main")
    b.kernel("main", writes="x")
    b.kernel("side", reads="x")
    b.free("x")
    b.kernel("main")
    b.wait("never", "side")
    return b


def test_analyze_runs_every_analysis():
    kinds = {h.kind for h in analysis.analyze(buggy().trace)}
    assert {"race", "missing-record-stream", "event-misuse"} <= kinds


def test_analyze_filters_kinds():
    hazards = analysis.analyze(buggy().trace, kinds=["race"])
    assert hazards and {h.kind for h in hazards} == {"race"}


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown hazard kind"):
        analysis.analyze(buggy().trace, kinds=["rase"])


def test_clean_trace_has_no_hazards():
    b = Build("main", "side")
    b.alloc("x")
    b.kernel("main", writes="x")
    b.wait_stream("side", "main")
    b.kernel("side", reads="x")
    b.record_stream("x", "side")
    b.free("x")
    b.kernel("main")
    assert analysis.analyze(b.trace) == []


def test_registry_shares_one_happens_before(monkeypatch):
    seen = []

    def spy(trace, cache):
        seen.append(happens_before.of(trace, cache))
        return []

    monkeypatch.setattr(analysis, "REGISTRY", analysis.REGISTRY + [(None, spy), (None, spy)])
    analysis.analyze(buggy().trace)
    assert len(seen) == 2 and seen[0] is seen[1]


def test_optional_module_missing_is_skipped(monkeypatch):
    monkeypatch.setattr(analysis, "REGISTRY", [(None, analysis._optional("no_such_module"))])
    assert analysis.analyze(buggy().trace) == []


@pytest.mark.parametrize("takes_cache", [True, False])
def test_optional_module_is_called_with_or_without_cache(monkeypatch, takes_cache):
    name = f"{analysis.__name__}.fake_extra"
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    calls = []
    if takes_cache:
        module.find = lambda trace, cache=None: calls.append(cache) or []
    else:
        module.find = lambda trace: calls.append("no cache") or []
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(analysis, "REGISTRY", [(None, analysis._optional("fake_extra"))])
    analysis.analyze(buggy().trace)
    assert calls == ([{}] if takes_cache else ["no cache"])


def test_analyses_import_no_torch():
    code = ("import sys; sys.path.insert(0, 'tests');"
            "from analysis.test_analyze import buggy;"
            "from pytest_npugraph.analysis import events, races, record_stream;"
            "t = buggy().trace; races.find(t); record_stream.find(t); events.find(t);"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_repo_root())


def _repo_root():
    import pathlib
    return pathlib.Path(__file__).resolve().parents[2]
