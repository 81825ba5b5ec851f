"""The plugin's outputs as users meet them: --npu-trace-dir, --npu-html (and their ini keys), the
report header, the failure section pointing at the timeline, and the summary table."""
import json
import re

import pytest

TESTS = """
import torch, torch_npu

def test_race():
    x = torch.ones(4, device="npu")
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        y = x * 2
    z = y + 1

def test_expected(npugraph):
    x = torch.ones(4, device="npu")
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        y = x * 2
    with npugraph.expect("race"):
        z = y + 1

def test_clean():
    x = torch.ones(4, device="npu")
    assert (x * 2).cpu().tolist() == [2.0] * 4

def test_no_npu():
    assert True
"""


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:randomly", "--npu-emulate=on", *args)


def test_trace_dir_writes_one_chrome_trace_per_npu_test_named_from_its_nodeid(pytester):
    pytester.makepyfile(test_model=TESTS)
    result = run(pytester, "--npu-trace-dir=out/traces")
    result.assert_outcomes(passed=3, failed=1)
    traces = pytester.path / "out" / "traces"
    assert sorted(p.name for p in traces.iterdir()) == [
        "test_model.py__test_clean.json", "test_model.py__test_expected.json", "test_model.py__test_race.json"]
    result.stdout.fnmatch_lines([f"npugraph: Chrome traces to {traces}",
                                 f"timeline: {traces / 'test_model.py__test_race.json'}",
                                 f"npugraph: Chrome traces in {traces} (3 files*"])
    race = json.loads((traces / "test_model.py__test_race.json").read_text())
    assert [h["status"] for h in race["otherData"]["hazards"]] == ["failed", "failed"]
    marks = [e for e in race["traceEvents"] if e.get("cat") == "hazard"]
    assert marks and all(e["args"]["status"] == "failed" for e in marks)
    expected = json.loads((traces / "test_model.py__test_expected.json").read_text())
    assert {h["status"] for h in expected["otherData"]["hazards"]} == {"expected"}


def test_ini_keys_are_relative_to_the_rootdir(pytester, monkeypatch):
    pytester.makeini("[pytest]\nnpu_trace_dir = out/t\nnpu_html = out/report.html\n")
    pytester.makepyfile(test_model=TESTS)
    monkeypatch.chdir(pytester.mkdir("sub"))                  # invoked from elsewhere
    run(pytester, str(pytester.path / "test_model.py"), "-k", "clean").assert_outcomes(passed=1)
    assert (pytester.path / "out" / "t" / "test_model.py__test_clean.json").exists()
    assert (pytester.path / "out" / "report.html").exists()
    assert not (pytester.path / "sub" / "out").exists()


def test_html_report_is_self_contained_and_shows_each_npu_test_with_its_hazards(pytester):
    pytester.makepyfile(test_model=TESTS)
    run(pytester, "--npu-html=report.html").assert_outcomes(passed=3, failed=1)
    page = (pytester.path / "report.html").read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(?<![\w-])(src|href)\s*=\s*["']|@import|url\((?!#)""", page)   # nothing to fetch
    sections = re.findall(r"<details class='test outcome-(\w+)' id='test-\d+' data-nodeid='([^']+)'", page)
    assert sorted(sections) == [("failed", "test_model.py::test_race"), ("passed", "test_model.py::test_clean"),
                                ("passed", "test_model.py::test_expected")]
    assert sections[0] == ("failed", "test_model.py::test_race")       # failing tests first
    assert page.count("class='hazard status-failed'") == 2 and page.count("class='hazard status-expected'") == 1
    assert "<tr data-kind='race'><td>race</td><td class=''>2</td><td class=''>1</td>" in page
    assert "4 tests (1 failed, 3 passed), 3 used the NPU" in page


def test_html_report_under_xdist_has_the_same_tests(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_model=TESTS)
    run(pytester, "-n", "2", "--npu-html=report.html").assert_outcomes(passed=3, failed=1)
    page = (pytester.path / "report.html").read_text()
    assert sorted(re.findall(r"data-nodeid='([^']+)'", page)) == [
        "test_model.py::test_clean", "test_model.py::test_expected", "test_model.py::test_race"]
    assert page.count("<script type='application/json'") == 3


def test_header_summary_table_total_and_kinds_not_found(pytester):
    pytester.makepyfile(test_model=TESTS)
    result = run(pytester, "--npu-html=r.html")
    result.stdout.fnmatch_lines([
        "npugraph: NPU emulation on (*",
        "npugraph: 1 emulated device per test (@pytest.mark.npu_devices(N) for more)",
        f"npugraph: HTML report to {pytester.path / 'r.html'}",
    ])
    result.stdout.fnmatch_lines(["*npugraph hazards by kind*",
                                 "race * 2 * 1 * 0 * 0 * 0 * test_expected, test_race",
                                 "total * 2 * 1 * 0 * 0 * 0 * 2 test(s)",
                                 "kinds not found in this run: missing-record-stream, event-misuse, *super-kernel",
                                 f"npugraph: HTML report {pytester.path / 'r.html'}"])


def test_file_names_are_readable_and_safe():
    from pytest_npugraph.report.export import file_name

    assert file_name("tests/a.py::test_b[x-1]") == "tests_a.py__test_b_x-1.json"
    odd = file_name("tests/a.py::test_b[a b/c?]")
    assert re.fullmatch(r"tests_a\.py__test_b_a_b_c-[0-9a-f]{8}\.json", odd)
    assert file_name("t.py::test_b[a b]") != file_name("t.py::test_b[a_b]")
    assert len(file_name("t.py::test_" + "x" * 300)) < 140


def test_long_traces_are_cut_for_the_page_but_not_for_the_trace_file(tmp_path, monkeypatch):
    from analysis.tracebuild import Build
    from pytest_npugraph.hazard import Hazard
    from pytest_npugraph.report import export

    monkeypatch.setattr(export, "HTML_MAX_TASKS", 5)
    b = Build("main")
    seqs = [b.kernel("main", op=f"aten::op{i}") for i in range(20)]
    late = Hazard("race", "late one", seqs=(seqs[15],))

    class Item:
        nodeid, user_properties = "t.py::test_long", []

    class Config:
        pass

    path = export.Export(Config(), tmp_path / "traces", tmp_path / "r.html", "header").capture(
        Item, b.trace, [late], {late.key: "failed"})
    assert len([e for e in json.loads(open(path).read())["traceEvents"] if e["ph"] == "X"]) == 20
    ((name, value),) = Item.user_properties
    shown = [e["name"] for e in json.loads(value)["traceEvents"] if e["ph"] == "X"]
    assert name == export.PROPERTY and shown == ["op0", "op1", "op2", "op3", "op4", "op15"]


def test_page_escapes_what_tests_and_hazards_contain():
    from pytest_npugraph.report.html import render

    data = {"traceEvents": [], "otherData": {"hazards": [
        {"kind": "race", "status": "failed", "severity": "error", "message": "</script><b>x</b> & y",
         "where": [], "streams": [], "ops": []}], "streams": {}, "truncated": False}}
    page = render([{"nodeid": "t.py::test_a[<'q'>]", "outcome": "failed", "duration": 1.0,
                    "timeline": json.dumps(data)}], "hdr <x>")
    assert page.count("</script>") == 2 and "</script><b>" not in page   # the data block and the page's script
    (payload,) = re.findall(r"<script type='application/json' id='trace-0'>(.*?)</script>", page)
    assert json.loads(payload) == data
    assert "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt; &amp; y" in page       # the message, as text
    assert "data-nodeid='t.py::test_a[&lt;&#x27;q&#x27;&gt;]'" in page and "hdr &lt;x&gt;" in page
