"""The HTML report as a person sees it: rendered by headless Chromium (no network), the page's
script draws a track per device and stream, kernel slices, event and collective arrows and hazard
markers.  Skips when /usr/bin/chromium is absent (.ci/run installs it)."""
import os
import re
import subprocess
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
    run = subprocess.run(["python", "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "--npu-emulate=on",
                          f"--npu-html={root / 'report.html'}", str(root / "test_suite.py")],
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert "1 failed, 4 passed" in run.stdout, run.stdout + run.stderr
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
    return page, shot


def test_every_section_is_drawn_by_the_page_script(rendered):
    page, _ = rendered
    (body,) = [a for t, _, a in page.found if t == "body"]
    assert body["data-rendered"] == "4"                # test_no_npu has no timeline
    assert len(page.select("svg", "timeline-svg")) == 4


def test_tracks_per_device_and_stream(rendered):
    page, _ = rendered
    tracks = [a["data-track"] for a in page.select("g", "track")]
    assert {"npu:0/default", "npu:0/stream-0", "npu:1/default"} <= set(tracks)
    assert {a["data-device"] for a in page.select("g", "track")} == {"npu:0", "npu:1"}


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
    assert {a["data-kind"] for a in markers} == {"race"}
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
