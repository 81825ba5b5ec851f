"""The documentation ships with the project: docs/ builds as a site with no broken link or anchor, and
nothing users read points outside the repository (issue 27)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def mkdocs():
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")


def test_the_docs_site_builds_without_a_broken_link(mkdocs, tmp_path):
    result = mkdocs_build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "reference" / "index.html").exists()
    assert (tmp_path / "site" / "hazards" / "deadlock" / "index.html").exists()


def test_the_docs_check_fails_on_a_broken_anchor(mkdocs, tmp_path):
    """The check can fail: a link to a section that does not exist aborts the strict build."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs", symlinks=False)
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "quickstart.md", "a", encoding="utf-8") as f:
        f.write("\nSee [the options](reference.md#no-such-section).\n")
    result = mkdocs_build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stderr


def test_nothing_users_read_points_outside_the_repository():
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in texts
                 if "CONTRACT §" in p.read_text(encoding="utf-8") or "../shared" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_the_reference_names_every_option_marker_and_hazard_kind():
    from pytest_npugraph.hazard import KINDS
    from pytest_npugraph.markers import MARKERS

    reference = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    plugin = (ROOT / "src" / "pytest_npugraph" / "plugin.py").read_text(encoding="utf-8")

    options = set(re.findall(r'addoption\("(--npu-[a-z-]+)"', plugin))
    assert options and all(f"`{o}" in reference for o in options), options
    assert all(f"@pytest.mark.{marker}" in reference for marker in MARKERS)
    assert all(f"`{kind}`" in reference for kind in KINDS)
    for hook in ("pytest_npugraph_op_profile", "pytest_npugraph_register_ops", "pytest_npugraph_hazard"):
        assert hook in reference


def test_project_urls_and_changelog_ship():
    tomllib = pytest.importorskip("tomllib")      # Python 3.11+

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert {"Documentation", "Source", "Issues"} <= set(meta["urls"])
    assert any(d.split(">")[0].split("=")[0].strip() == "numpy" for d in meta["dependencies"])
    assert "mkdocs" in " ".join(meta["optional-dependencies"]["docs"])
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog")


def test_the_deadlock_page_shows_the_example_file_verbatim():
    """docs/hazards/deadlock.md's code is examples/test_deadlock_default_chip.py, which runs as a test."""
    page = (ROOT / "docs" / "hazards" / "deadlock.md").read_text(encoding="utf-8")
    example = (ROOT / "examples" / "test_deadlock_default_chip.py").read_text(encoding="utf-8")
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert "def step(rank, nonzero_limit=None):" in code
    assert code == example[example.index("import pytest"):]


def test_hookspecs_are_typed_and_document_every_parameter():
    import inspect
    import typing

    from pytest_npugraph import hookspecs

    specs = [getattr(hookspecs, name) for name in dir(hookspecs) if name.startswith("pytest_npugraph_")]
    assert len(specs) == 3
    for spec in specs:
        hints = typing.get_type_hints(spec, {**vars(hookspecs), **_type_names()})
        params = inspect.signature(spec).parameters
        assert set(params) <= set(hints) and "return" in hints, spec.__name__
        for name in params:
            assert f":param {name}:" in spec.__doc__, (spec.__name__, name)


def _type_names() -> dict:
    from pytest_npugraph.hazard import Hazard
    from pytest_npugraph.runtime.ops.library import OpRegistry

    return {"Hazard": Hazard, "OpRegistry": OpRegistry}
