"""Every sample in docs/ is checked against the code it shows and a real run of it (issue 27): the docs
cannot go stale again.

A fenced block in docs/ is marked by the HTML comment right above it:

* ``<!-- sample-code: examples/test_x.py -->`` above a code block: each of its lines (``...`` lines
  left out, whitespace, indentation and comments ignored) is a line of that file, in the same order;
* ``<!-- sample-output: examples/test_x.py::test_name KIND -->`` above a text block: the block is the
  report of a KIND hazard found when that test runs;
* ``<!-- sample-output: pytest FILE -->`` above a text block: the block is in the terminal output
  of ``pytest FILE`` (of its directory for a conftest.py), FILE being the code block of the same page
  whose first line is ``# FILE``.

Compared with whitespace collapsed (docs wrap long lines) and device addresses (``0x12c000200000``,
which change between runs) left out; a ``...`` in a sample stands for text left out.  Every text block
(a fence with no language) in docs/ must be marked (a page's non-sample text block says
``<!-- not-a-sample -->``)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*?) -->\n)?```(?P<lang>[\w-]*)\n(?P<text>.*?)^```", re.S | re.M)

DUMP = """
import json, os
def pytest_npugraph_hazard(item, hazard):
    with open(os.environ["DOC_SAMPLES_OUT"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": item.nodeid, "kind": hazard.kind, "message": hazard.message}) + "\\n")
"""


def blocks() -> list:
    """(page, mark, language, text) of every fenced block in docs/."""
    found = []
    for page in DOCS:
        for m in BLOCK.finditer(page.read_text(encoding="utf-8")):
            found.append((page.relative_to(ROOT).as_posix(), m["mark"] or "", m["lang"], m["text"]))
    return found


def marked(prefix: str) -> list:
    return [(page, mark[len(prefix):].strip(), text) for page, mark, _, text in blocks() if mark.startswith(prefix)]


def normal(text: str) -> str:
    return " ".join(re.sub(r"0x[0-9a-f]{5,}", "0x?", text).split())


def shown_in(sample: str, real: str, whole: bool) -> bool:
    """``sample`` is ``real`` (``whole``) or a part of it, ``...`` standing for left-out text."""
    pieces = [re.escape(p.strip()) for p in normal(sample).split("...")]
    pattern = r"\s*.*?\s*".join(pieces)
    return (re.fullmatch if whole else re.search)(pattern, normal(real), re.S) is not None


def _code_lines(text: str) -> list:
    """Lines of code, whitespace collapsed, comments (the docs may word them for the page) left out."""
    lines = (" ".join(re.sub(r"(^|\s)#.*$", "", line).split()) for line in text.splitlines())
    return [line for line in lines if line and line != "..."]


# ------------------------------------------------------------------------------ the checks can fail
def test_a_changed_word_or_a_made_up_line_fails_the_comparison():
    real = "race on the tensor allocated at x.py:3 (512 bytes at 0x12c000400000 of npu:0): fix it"
    assert shown_in("race on the tensor\nallocated at x.py:3 (512 bytes at 0x19c000000e00 of npu:0): fix it", real, True)
    assert shown_in("race on the tensor allocated at ... fix it", real, True)
    assert not shown_in("race on the tensor allocated at x.py:4 ... fix it", real, True)
    assert not shown_in("race on the tensor allocated", real, True)          # a cut report is not the report
    assert shown_in("race on the tensor allocated", real, False)


def test_every_text_block_in_the_docs_is_a_checked_sample():
    unmarked = [(page, text.splitlines()[0] if text else "") for page, mark, lang, text in blocks()
                if not lang and not mark.startswith(("sample-output:", "not-a-sample"))]
    assert unmarked == []
    assert len(marked("sample-output:")) >= 8


# ----------------------------------------------------------------------------------- code samples
@pytest.mark.parametrize("page,source,text", marked("sample-code:"), ids=lambda v: str(v)[:60])
def test_code_samples_are_lines_of_the_file_they_name(page, source, text):
    lines = _code_lines((ROOT / source).read_text(encoding="utf-8"))
    at = 0
    for line in _code_lines(text):
        assert line in lines[at:], f"{page}: {line!r} is not in {source} (after line {at})"
        at = lines.index(line, at) + 1


# ------------------------------------------------------------------------------- output samples
@pytest.fixture(scope="module")
def example_reports(tmp_path_factory) -> list:
    """The hazards of every examples/ test a sample names, from one pytest run."""
    tests = sorted({source.split()[0] for _, source, _ in marked("sample-output:") if "::" in source})
    tmp = tmp_path_factory.mktemp("doc_samples")
    (tmp / "doc_samples_dump.py").write_text(DUMP, encoding="utf-8")
    out = tmp / "hazards.jsonl"
    env = {**__import__("os").environ, "DOC_SAMPLES_OUT": str(out),
           "PYTHONPATH": str(tmp) + ":" + __import__("os").environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                          "-p", "doc_samples_dump", "-W", "ignore::DeprecationWarning"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("page,source,text", [s for s in marked("sample-output:") if "::" in s[1]],
                         ids=lambda v: str(v)[:60])
def test_report_samples_are_what_the_example_reports(page, source, text, example_reports):
    test, kind = source.split()
    found = [r["message"] for r in example_reports if r["test"] == test and r["kind"] == kind]
    assert found, f"{page}: {test} reports no {kind}"
    assert any(shown_in(text, message, whole=True) for message in found), (
        f"{page}: the sample is not what {test} reports; it reports:\n\n" + "\n\n".join(found))


@pytest.mark.parametrize("page,source,text", [s for s in marked("sample-output:") if s[1].startswith("pytest ")],
                         ids=lambda v: str(v)[:60])
def test_terminal_samples_are_what_pytest_prints(page, source, text, pytester, monkeypatch):
    name = source.split()[1]
    (code,) = [t for p, _, lang, t in blocks() if p == page and lang == "python" and t.split("\n", 1)[0].split()[:2] == ["#", name]]
    path = pytester.path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code, encoding="utf-8")
    target = str(path.parent if path.name == "conftest.py" else path)      # a conftest: run its directory
    monkeypatch.setenv("COLUMNS", "80")     # the samples show an 80-column terminal (CI's may be wider)
    run = pytester.runpytest_subprocess(target, "-p", "no:randomly", "-p", "no:cacheprovider")
    real = run.stdout.str() + "\n" + run.stderr.str()
    assert shown_in(text, real, whole=False), f"{page}: the sample is not in the output of pytest {name}:\n{real}"
