"""A self-contained HTML report of a session (``--npu-html PATH``).

One page, no network resources (a Content-Security-Policy forbids them): inline CSS, inline JS and
inline SVG.  Each test that used the NPU gets a section with its outcome, its hazards (kind, status,
message) and its timeline, drawn in the browser from the test's Chrome-trace JSON (timeline.py,
embedded as ``<script type="application/json">``): a track per device and stream, kernel slices
coloured by core kind, event record -> wait and collective flow arrows, hazard markers.  Clicking a
hazard highlights its markers; a zoom slider widens the timelines.
"""
from __future__ import annotations

import datetime
import html
import json
from collections import Counter, defaultdict

from ..hazard import KINDS

STATUSES = ("failed", "expected", "allowed", "warning", "recorded")

CSS = """
:root { --fg:#1d2330; --muted:#667085; --line:#d0d5dd; --bg:#f8f9fb; --bad:#d92d20; --ok:#12b76a; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif; color:var(--fg); background:var(--bg); }
header { padding:16px 24px 8px; background:#fff; border-bottom:1px solid var(--line); }
h1 { font-size:20px; margin:0 0 4px; }
.meta { color:var(--muted); margin:0 0 10px; }
table.summary { border-collapse:collapse; margin:6px 0 10px; }
table.summary th, table.summary td { border:1px solid var(--line); padding:3px 10px; text-align:right; }
table.summary th:first-child, table.summary td:first-child { text-align:left; font-family:ui-monospace,monospace; }
table.summary td.zero { color:#c0c4cc; }
.controls { display:flex; gap:24px; align-items:center; color:var(--muted); }
main { padding:12px 24px 40px; }
details.test { background:#fff; border:1px solid var(--line); border-radius:8px; margin:10px 0; }
details.test > summary { cursor:pointer; padding:8px 12px; list-style:none; display:flex; gap:10px; align-items:center; }
details.test > summary code { font-size:13px; }
.badge { border-radius:10px; padding:1px 9px; font-size:12px; font-weight:600; color:#fff; background:var(--muted); }
.badge.passed { background:var(--ok); } .badge.failed, .badge.error { background:var(--bad); }
.badge.skipped, .badge.xfailed { background:#f79009; }
.counts { color:var(--muted); font-size:12px; margin-left:auto; }
.body { padding:0 12px 12px; }
ol.hazards { margin:4px 0 8px; padding-left:22px; }
li.hazard { margin:4px 0; cursor:pointer; }
li.hazard.hl { background:#fff4e5; }
li.hazard .kind { font-family:ui-monospace,monospace; font-weight:700; color:var(--bad); }
li.hazard .status { margin-left:8px; font-size:12px; color:var(--muted); }
li.hazard.status-failed .status { color:var(--bad); font-weight:600; }
li.hazard pre { white-space:pre-wrap; margin:2px 0 0; font-size:12px; color:#344054; }
.timeline { overflow-x:auto; border:1px solid var(--line); border-radius:6px; background:#fff; }
.legend { font-size:12px; color:var(--muted); margin:4px 0; }
.legend span { display:inline-block; width:10px; height:10px; margin:0 4px 0 12px; border-radius:2px; vertical-align:-1px; }
svg text { font:11px ui-monospace,monospace; fill:var(--fg); }
svg .label { font-weight:600; }
svg .device-label { font:700 12px system-ui,sans-serif; fill:#475467; }
svg .lane { fill:#f9fafb; } svg .track:nth-of-type(even) .lane { fill:#f2f4f7; }
svg .axis { stroke:#e4e7ec; } svg .tick { fill:var(--muted); font-size:10px; }
svg .slice { stroke:#0003; stroke-width:.5; rx:2; }
svg .slice.graph { stroke-dasharray:3 2; stroke:#1d2330; }
svg .slice-label { fill:#fff; font-size:10px; pointer-events:none; }
.k-AICore { fill:#2e90fa; background:#2e90fa; } .k-AIV { fill:#32d583; background:#32d583; }
.k-AICPU { fill:#fd853a; background:#fd853a; } .k-ATB { fill:#a15c07; background:#a15c07; }
.k-HCCL { fill:#7a5af8; background:#7a5af8; } .k-MC2 { fill:#ee46bc; background:#ee46bc; }
svg .evt { fill:#344054; } svg .evt.wait { fill:#fff; stroke:#344054; }
svg .flow { fill:none; stroke:#475467; stroke-width:1.2; }
svg .flow.collective { stroke:#7a5af8; stroke-dasharray:4 3; }
svg .sync { stroke:#98a2b3; stroke-dasharray:2 2; } svg .marker { fill:#6941c6; }
svg .hazard-marker path { fill:var(--bad); stroke:#fff; stroke-width:1; }
svg .hazard-marker line { stroke:var(--bad); stroke-width:1.5; stroke-dasharray:3 2; }
svg .hazard-marker.status-expected path, svg .hazard-marker.status-allowed path { fill:#f79009; }
svg .hazard-marker.status-expected line, svg .hazard-marker.status-allowed line { stroke:#f79009; }
svg .hazard-marker.hl path { stroke:#000; stroke-width:2; }
.empty { color:var(--muted); padding:8px; }
"""

JS = r"""
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg", LABEL_W = 200, ROW_H = 26, DEV_H = 20, TOP = 22;
  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function tip(parent, text) { el("title", {}, parent, text); }
  function fmt(us) { return us >= 1000 ? (us / 1000).toFixed(2) + " ms" : us.toFixed(us < 10 ? 1 : 0) + " \u00b5s"; }

  function render(box, data, zoom) {
    box.textContent = "";
    var ev = data.traceEvents, procs = {}, threads = {}, used = {}, t0 = Infinity, t1 = -Infinity;
    ev.forEach(function (e) {
      if (e.ph === "M") {
        if (e.name === "process_name") procs[e.pid] = e.args.name;
        if (e.name === "thread_name") threads[e.pid + ":" + e.tid] = {pid: e.pid, tid: e.tid, name: e.args.name};
        return;
      }
      if (e.s !== "p") used[e.pid + ":" + e.tid] = true;
      t0 = Math.min(t0, e.ts); t1 = Math.max(t1, e.ts + (e.dur || 0));
    });
    var rows = Object.keys(threads).filter(function (k) { return used[k]; }).map(function (k) { return threads[k]; });
    rows.sort(function (a, b) { return a.pid - b.pid || a.tid - b.tid; });
    if (!rows.length) { box.innerHTML = '<div class="empty">no device work recorded</div>'; return; }
    var width = Math.max(box.clientWidth || 900, 700) * zoom, span = Math.max(t1 - t0, 1);
    var x = function (ts) { return LABEL_W + (ts - t0) / span * (width - LABEL_W - 24); };
    var y = {}, devRows = {}, h = TOP, lastPid = null;
    rows.forEach(function (r) {
      if (r.pid !== lastPid) { devRows[r.pid] = {y: h, rows: []}; h += DEV_H; lastPid = r.pid; }
      y[r.pid + ":" + r.tid] = h; devRows[r.pid].rows.push(r); h += ROW_H;
    });
    var svg = el("svg", {width: width, height: h + 8, "class": "timeline-svg"}, box);
    var defs = el("defs", {}, svg);
    var arrow = el("marker", {id: box.id + "-arrow", viewBox: "0 0 8 8", refX: 7, refY: 4, markerWidth: 7,
                              markerHeight: 7, orient: "auto-start-reverse"}, defs);
    el("path", {d: "M0,0 L8,4 L0,8 z", fill: "#475467"}, arrow);
    for (var i = 0; i <= 8; i++) {
      var tx = LABEL_W + i * (width - LABEL_W - 24) / 8;
      el("line", {x1: tx, x2: tx, y1: TOP - 4, y2: h, "class": "axis"}, svg);
      el("text", {x: tx + 2, y: 12, "class": "tick"}, svg, fmt(i * span / 8));
    }
    Object.keys(devRows).forEach(function (pid) {
      el("text", {x: 6, y: devRows[pid].y + 14, "class": "device-label"}, svg, procs[pid] || ("device " + pid));
    });
    rows.forEach(function (r) {
      var g = el("g", {"class": "track", "data-track": r.name, "data-device": procs[r.pid] || r.pid}, svg);
      var ty = y[r.pid + ":" + r.tid];
      el("rect", {x: 0, y: ty, width: width, height: ROW_H - 2, "class": "lane"}, g);
      el("text", {x: 14, y: ty + 16, "class": "label"}, g, r.name.replace(/^npu:\d+\//, ""));
    });
    var layer = el("g", {"class": "slices"}, svg), marks = el("g", {"class": "marks"}, svg);
    var flows = {}, pos = function (e) { return [x(e.ts), y[e.pid + ":" + e.tid] + ROW_H / 2 - 1]; };
    ev.forEach(function (e) {
      if (e.ph === "M") return;
      var key = e.pid + ":" + e.tid, ty = y[key];
      if (e.ph === "X" && ty !== undefined) {
        var w = Math.max((e.dur || 0) / span * (width - LABEL_W - 24), 2), a = e.args || {};
        var kinds = (e.cat || "").split(","), rect = el("rect", {x: x(e.ts), y: ty + 3, width: w, height: ROW_H - 8,
          "class": "slice k-" + kinds[0] + (kinds.indexOf("graph") >= 0 ? " graph" : ""), "data-op": a.op || e.name}, layer);
        tip(rect, (a.op || e.name) + "  @ " + a.where + "\ncores: " + a.kind + ", cube " + a.cube + ", vector " + a.vector +
          (a.all_resident ? " (all blocks at once)" : "") + (a.cube_limit || a.vector_limit ? "\nlimit: cube " +
          a.cube_limit + ", vector " + a.vector_limit + (a.limit_applies ? "" : " (does not take effect)") : "") +
          (a.graph ? "\ngraph: " + a.graph : "") + (a.collective ? "\ncollective: " + a.collective : "") +
          "\n" + fmt(e.ts - t0) + " + " + fmt(e.dur || 0));
        if (w > 46) el("text", {x: x(e.ts) + 3, y: ty + 16, "class": "slice-label"}, layer,
                       e.name.slice(0, Math.floor(w / 6.5)));
      } else if (e.ph === "i" && e.cat === "hazard" && ty !== undefined) {
        var hx = x(e.ts), hg = el("g", {"class": "hazard-marker status-" + e.args.status, "data-hazard": e.args.hazard,
                                         "data-kind": e.name.replace("HAZARD ", "")}, marks);
        el("line", {x1: hx, x2: hx, y1: ty, y2: ty + ROW_H - 2}, hg);
        el("path", {d: "M" + (hx - 6) + "," + (ty - 1) + " l12,0 l-6,9 z"}, hg);
        tip(hg, e.name + " (" + e.args.status + ")\n" + e.args.message);
      } else if (e.ph === "i" && (e.cat === "record" || e.cat === "wait") && ty !== undefined) {
        var ex = x(e.ts), d = e.cat === "record" ? "M" + (ex - 3.5) + "," + (ty + ROW_H - 3) + " l7,0 l-3.5,-6 z"
                                                 : "M" + (ex - 3.5) + "," + (ty + 2) + " l7,0 l-3.5,6 z";
        tip(el("path", {d: d, "class": "evt " + e.cat}, marks), e.name + "  @ " + e.args.where);
      } else if (e.ph === "i" && (e.cat === "sync" || e.cat === "marker" || e.cat === "memory")) {
        var sx = x(e.ts), lines = e.s === "p" ? (devRows[e.pid] || {rows: []}).rows : [{pid: e.pid, tid: e.tid}];
        lines.forEach(function (r) {
          var sy = y[r.pid + ":" + r.tid];
          if (sy === undefined) return;
          var m = e.cat === "sync" ? el("line", {x1: sx, x2: sx, y1: sy, y2: sy + ROW_H - 2, "class": "sync"}, marks)
                                   : el("circle", {cx: sx, cy: sy + 4, r: 2.5, "class": "marker"}, marks);
          tip(m, e.name + "  @ " + (e.args.where || "") + (e.args.detail ? "\n" + e.args.detail.join(", ") : ""));
        });
      } else if (e.ph === "s" || e.ph === "t" || e.ph === "f") {
        (flows[e.cat + ":" + e.id] = flows[e.cat + ":" + e.id] || []).push(e);
      }
    });
    var flowLayer = el("g", {"class": "flows"}, svg);
    Object.keys(flows).forEach(function (k) {
      var chain = flows[k];
      for (var i = 1; i < chain.length; i++) {
        if (y[chain[i].pid + ":" + chain[i].tid] === undefined || y[chain[i - 1].pid + ":" + chain[i - 1].tid] === undefined) continue;
        var a = pos(chain[i - 1]), b = pos(chain[i]), mid = (a[1] + b[1]) / 2;
        var p = el("path", {d: "M" + a[0] + "," + a[1] + " C" + a[0] + "," + mid + " " + b[0] + "," + mid + " " + b[0] + "," + b[1],
                            "class": "flow " + chain[i].cat, "marker-end": "url(#" + box.id + "-arrow)"}, flowLayer);
        tip(p, chain[i].cat + " " + chain[i].name);
      }
    });
    svg.appendChild(marks);
  }

  var zoom = 1;
  function renderAll() {
    document.querySelectorAll(".timeline").forEach(function (box) {
      var src = document.getElementById(box.getAttribute("data-src"));
      if (src) render(box, JSON.parse(src.textContent), zoom);
    });
  }
  function highlight(test, n) {
    test.querySelectorAll(".hl").forEach(function (e) { e.classList.remove("hl"); });
    test.querySelectorAll('[data-hazard="' + n + '"]').forEach(function (e) { e.classList.add("hl"); });
  }
  document.addEventListener("click", function (ev) {
    var item = ev.target.closest("li.hazard, .hazard-marker");
    if (!item) return;
    var test = item.closest("details.test");
    highlight(test, item.getAttribute("data-hazard"));
    if (item.tagName === "LI") { var m = test.querySelector('.hazard-marker[data-hazard="' + item.getAttribute("data-hazard") + '"]');
      if (m) m.scrollIntoView({block: "nearest", inline: "center"}); }
  });
  var slider = document.getElementById("zoom");
  if (slider) slider.addEventListener("change", function () { zoom = parseFloat(slider.value); renderAll(); });
  var only = document.getElementById("only-hazards");
  if (only) only.addEventListener("change", function () {
    document.querySelectorAll("details.test").forEach(function (d) {
      d.hidden = only.checked && d.getAttribute("data-hazards") === "0";
    });
  });
  renderAll();
  document.body.setAttribute("data-rendered", document.querySelectorAll(".timeline-svg").length);
})();
"""

LEGEND = ("AICore", "AIV", "AICPU", "ATB", "HCCL", "MC2")
EXPAND_UP_TO = 12      # sections shown open when the page has at most this many (else: those with findings)


def render(entries: list, header: str, elapsed: float = 0.0) -> str:
    """The page for ``entries`` (dicts with ``nodeid``, ``outcome``, ``duration`` and ``timeline``, the
    test's Chrome-trace JSON as a string or None); tests without a timeline are only counted."""
    shown = [e for e in entries if e.get("timeline")]
    data = [json.loads(e["timeline"]) for e in shown]
    outcomes = Counter(e["outcome"] for e in entries)
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    parts = [
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<title>pytest-npugraph report</title>", f"<style>{CSS}</style></head><body>",
        "<header><h1>pytest-npugraph report</h1>",
        f"<p class='meta'>{html.escape(header)} &middot; {len(entries)} tests ("
        + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) + f"), {len(shown)} used the NPU &middot; "
        f"{elapsed:.1f} s &middot; {now}</p>",
        _summary_table(data),
        "<div class='controls'><label><input type='checkbox' id='only-hazards'> only tests with hazards</label>"
        "<label>zoom <input type='range' id='zoom' min='1' max='8' step='0.5' value='1'></label>"
        "<span class='legend'>" + "".join(f"<span class='k-{k}'></span>{k}" for k in LEGEND)
        + " &nbsp; dashed outline: graph replay &nbsp; &#9660; hazard</span></div></header><main>",
    ]
    order = sorted(range(len(shown)), key=lambda i: (not _failing(shown[i], data[i]), shown[i]["nodeid"]))
    for i in order:
        parts.append(_section(i, shown[i], data[i], expand=len(shown) <= EXPAND_UP_TO))
    if not shown:
        parts.append("<p class='empty'>No test used the emulated NPU.</p>")
    parts.append(f"</main><script>{JS}</script></body></html>\n")
    return "\n".join(parts)


def _failing(entry: dict, data: dict) -> bool:
    return entry["outcome"] in ("failed", "error") or any(
        h["status"] == "failed" for h in data["otherData"]["hazards"])


def _summary_table(data: list) -> str:
    counts = defaultdict(Counter)
    for d in data:
        for h in d["otherData"]["hazards"]:
            counts[h["kind"]][h["status"]] += 1
    if not counts:
        return "<p class='meta'>No hazards found.</p>"
    rows = ["<table class='summary'><tr><th>hazard kind</th>" + "".join(f"<th>{s}</th>" for s in STATUSES) + "</tr>"]
    for kind in KINDS:
        if kind in counts:
            cells = "".join(f"<td class='{'zero' if not counts[kind][s] else ''}'>{counts[kind][s]}</td>"
                            for s in STATUSES)
            rows.append(f"<tr data-kind='{kind}'><td>{kind}</td>{cells}</tr>")
    return "".join(rows) + "</table>"


def _section(i: int, entry: dict, data: dict, expand: bool) -> str:
    hazards = data["otherData"]["hazards"]
    by_kind = Counter(h["kind"] for h in hazards)
    counts = ", ".join(f"{k} &times;{n}" for k, n in sorted(by_kind.items())) or "no hazards"
    items = "".join(
        f"<li class='hazard status-{h['status']}' data-hazard='{n}'><span class='kind'>{h['kind']}</span>"
        f"<span class='status'>{h['status']}</span><pre>{html.escape(h['message'])}</pre></li>"
        for n, h in enumerate(hazards))
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")   # no </script>, no <!--
    truncated = ("<p class='meta'>Long trace: the first tasks and every task a hazard names are drawn; the "
                 "--npu-trace-dir file holds all.</p>") if data["otherData"].get("truncated") else ""
    opened = " open" if expand or hazards or entry["outcome"] in ("failed", "error") else ""
    outcome = html.escape(entry["outcome"])
    return (f"<details class='test outcome-{outcome}' id='test-{i}' data-nodeid='{html.escape(entry['nodeid'], True)}' "
            f"data-hazards='{len(hazards)}'{opened}><summary><span class='badge {outcome}'>{outcome}</span>"
            f"<code>{html.escape(entry['nodeid'])}</code><span class='counts'>{counts} &middot; "
            f"{entry.get('duration', 0.0):.2f} s</span></summary><div class='body'>"
            + (f"<ol class='hazards'>{items}</ol>" if items else "") + truncated
            + f"<div class='timeline' id='tl-{i}' data-src='trace-{i}'></div>"
            f"<script type='application/json' id='trace-{i}'>{payload}</script></div></details>")
