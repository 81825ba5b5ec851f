"""The HTML report as a person sees it: rendered by headless Chromium (no network), the page's
script draws a track per device and stream, kernel slices, event and collective arrows and hazard
markers, with streams named as the user named them (an ``npu_stream_switch`` tag) and one report per
root cause (a deadlock with its core oversubscription inside).  Skips when /usr/bin/chromium is absent
(.ci/run installs it)."""
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from .test_options import TESTS

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

SUITE = TESTS + """
import pytest
import torch.distributed as dist

def all_reduce(rank):
    dist.init_process_group("hccl", rank=rank, world_size=2)
    t = torch.full((8, 8), float(rank + 1), device="npu")
    dist.all_reduce(t)
    return (t @ t).cpu()

@pytest.mark.npu_devices(2)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_two_cards(npugraph):
    assert [r[0, 0].item() for r in npugraph.run_ranks(all_reduce)] == [72.0, 72.0]

import torchair as tng
from torchair.configs.compiler_config import CompilerConfig

class Tagged(torch.nn.Module):
    def forward(self, a, b):
        with tng.scope.npu_stream_switch("7"):
            c = torch.mm(a, b)
        with tng.scope.npu_stream_switch("8"):
            d = c + 1                          # no tagged event orders it after the mm
        return d

def test_tag_race(npugraph):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    model = torch.compile(Tagged(), backend=tng.get_npu_backend(compiler_config=config), fullgraph=True)
    with npugraph.expect("race", match="Tagged.forward:tag '8'"):
        model(torch.ones(4, 4, device="npu"), torch.ones(4, 4, device="npu"))

def aiv_step(rank):
    tp, ep = dist.new_group([0, 1]), dist.new_group([0, 1])
    grads, tokens = torch.ones(4, device="npu"), torch.ones(4, device="npu")
    mask = torch.arange(12, device="npu") % 3 == rank
    main = torch.npu.current_stream()
    streams = [torch.npu.Stream() for _ in range(3)]
    torch.npu.set_stream_limit(streams[0], vector_num=16)
    torch.npu.set_stream_limit(streams[1], vector_num=24)
    for s in streams:
        s.wait_stream(main)
    received = torch.empty(4, device="npu")
    def all_reduce():
        with torch.npu.stream(streams[0]):
            dist.all_reduce(grads, group=tp)
    def all_to_all():
        with torch.npu.stream(streams[1]):
            dist.all_to_all_single(received, tokens, group=ep)
    for launch in ((all_reduce, all_to_all) if rank == 0 else (all_to_all, all_reduce)):
        launch()
    with torch.npu.stream(streams[2]):
        kept = torch.nonzero(mask)
    for s in streams:
        main.wait_stream(s)

@pytest.mark.npu_devices(2)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_cards_deadlock(npugraph, monkeypatch):
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    with npugraph.expect("deadlock", match="cause: 3 ops on npu:0, npu:1"):
        npugraph.run_ranks(aiv_step)
"""


class Elements(HTMLParser):
    """(tag, class, attributes) of every element of the rendered DOM."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.found.append((tag, attrs.get("class") or "", attrs))

    def select(self, tag, cls):
        return [a for t, c, a in self.found if t == tag and cls in c.split()]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install chromium) to render the "
                    "HTML report; .ci/run does")
    root = tmp_path_factory.mktemp("suite")
    (root / "test_suite.py").write_text(SUITE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "--npu-emulate=on",
                          f"--npu-html={root / 'report.html'}", str(root / "test_suite.py")],
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert "1 failed, 6 passed" in run.stdout, run.stdout + run.stderr
    url = (root / "report.html").as_uri()

    def chromium(*args):
        profile = tmp_path_factory.mktemp("profile")
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, url],
                              capture_output=True, text=True, timeout=180)

    dom = chromium("--dump-dom")
    assert dom.returncode == 0, dom.stderr
    shot = root / "report.png"
    chromium("--window-size=1400,1600", "--hide-scrollbars", f"--screenshot={shot}")
    page = Elements()
    page.feed(dom.stdout)
    page.dom = dom.stdout
    return page, shot


def test_every_section_is_drawn_by_the_page_script(rendered):
    page, _ = rendered
    (body,) = [a for t, _, a in page.found if t == "body"]
    assert body["data-rendered"] == "6"                # test_no_npu has no timeline
    assert len(page.select("svg", "timeline-svg")) == 6


def test_tracks_per_device_and_stream(rendered):
    page, _ = rendered
    tracks = [a["data-track"] for a in page.select("g", "track")]
    assert {"npu:0/default", "npu:1/default"} <= set(tracks)
    assert "npu:0/stream-0 (made at test_suite.py:6)" in tracks           # test_race's side stream, by its line
    assert {a["data-device"] for a in page.select("g", "track")} == {"npu:0", "npu:1"}


def test_tracks_named_by_the_users_stream_tags(rendered):
    page, _ = rendered
    tracks = {a["data-track"] for a in page.select("g", "track")}
    tagged = {t for t in tracks if re.fullmatch(r"npu:0/Tagged\.forward:tag '[78]' \(stream-\d+\)", t)}
    assert len(tagged) == 2, tracks
    (race,) = [li for li in _hazard_items(page.dom) if "Tagged.forward:tag '8'" in li]
    assert "Tagged.forward:tag '7'" in race                   # both sides by their tags, as in the text report


def test_one_bug_one_report_with_its_cause_inside(rendered):
    page, _ = rendered
    section = page.dom[page.dom.index("test_cards_deadlock"):]
    section = section[:section.index("</details>")]
    items = _hazard_items(section)
    assert len(items) == 1 and "deadlock" in items[0], items
    assert "cause: 3 ops on npu:0, npu:1 may run at the same time and need 88 vector cores" in items[0]


def _hazard_items(dom: str) -> list:
    """The text of each hazard list item (kind, status and message) in ``dom``."""
    import html

    return [html.unescape(re.sub(r"<[^>]+>", " ", m)) for m in re.findall(r"<li class=\"hazard[^>]*>(.*?)</li>", dom, re.S)]


def test_slices_coloured_by_core_kind_with_their_ops(rendered):
    page, _ = rendered
    slices = page.select("rect", "slice")
    ops = {a["data-op"] for a in slices}
    assert {"aten::mul.Tensor", "aten::add.Tensor", "aten::mm", "hccl::all_reduce"} <= ops
    kinds = {c for _, cls, a in page.found if "slice" in cls.split() for c in cls.split() if c.startswith("k-")}
    assert {"k-AIV", "k-AICore", "k-HCCL"} <= kinds
    assert all(float(a["width"]) >= 2 for a in slices)


def test_hazard_markers_and_flow_arrows(rendered):
    page, _ = rendered
    markers = page.select("g", "hazard-marker")
    assert {a["data-kind"] for a in markers} == {"race", "deadlock"}
    statuses = [a["class"].split()[-1] for a in markers]
    assert statuses.count("status-failed") >= 2 and "status-expected" in statuses
    flows = page.select("path", "flow")
    assert any("event" in a["class"] for a in flows) and any("collective" in a["class"] for a in flows)
    assert all(re.match(r"M[\d.]+,[\d.]+ C", a["d"]) for a in flows)


def test_screenshot_is_a_full_page_image(rendered):
    _, shot = rendered
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1400, 1600) and len(data) > 30_000     # not a blank page
