"""``analyze``: runs the registry once per trace, filters kinds, tolerates missing modules."""
from __future__ import annotations

import subprocess
import sys

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


def test_every_kind_has_an_explicitly_imported_analysis():
    """The registry names functions, not module strings: a renamed module fails at import."""
    from pytest_npugraph.hazard import KINDS

    covered = {k for kinds, _ in analysis.REGISTRY for k in kinds}
    assert covered == set(KINDS)
    assert all(callable(function) and not isinstance(function, str) for _, function in analysis.REGISTRY)


def test_analyses_import_no_torch():
    code = ("import sys; sys.path.insert(0, 'tests');"
            "from analysis.test_analyze import buggy;"
            "from pytest_npugraph.analysis import analyze;"
            "t = buggy().trace; analyze(t);"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_repo_root())


def _repo_root():
    import pathlib
    return pathlib.Path(__file__).resolve().parents[2]
