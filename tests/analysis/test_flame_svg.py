"""SVG flame graphs: well-formed XML, counts readable back, hostile names inert, size bounded, JS works."""

import html
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from analysis.flamegraph.export import export_diff
from analysis.flamegraph.folded import parse_folded
from analysis.flamegraph.profile import Profile, clean_frame
from analysis.flamegraph.svg import Style, palette_color, render_svg, xml_escape
from tests.analysis.hostile_profiles import random_hostile_profile

SVG_NS = "{http://www.w3.org/2000/svg}"
HOSTILE = ["<script>alert(1)</script>", "</title><script>alert(2)</script>", 'say "hi" & <bye>',
           "it's", "]]>", "new\nline", "<![CDATA[x]]>", "&amp;"]

FOLDED = (
    "MainThread;serve (server.py:40);forward (model.py:12) 120\n"
    "MainThread;serve (server.py:40);tokenize (tok.py:3) 30\n"
    "MainThread;serve (server.py:40) 7\n"
    "swapper;do_idle_[k] 9\n"
)


def _frames(svg: str) -> list[dict]:
    root = ET.fromstring(svg.encode("utf-8"))
    group = root.find(f".//{SVG_NS}g[@id='frames']")
    out = []
    for g in group.findall(f"{SVG_NS}g"):
        title = g.find(f"{SVG_NS}title").text
        rect = g.find(f"{SVG_NS}rect")
        name, _, detail = title.rpartition(" (")
        count = int(detail.split(" ", 1)[0].replace(",", ""))
        out.append({"name": name, "count": count, "x": float(rect.get("x")),
                    "w": float(rect.get("width")), "y": float(rect.get("y")),
                    "label": g.find(f"{SVG_NS}text").text or ""})
    return out


def _stacks_from_svg(svg: str) -> dict[tuple[str, ...], int]:
    """Rebuild stacks from the drawing alone: depth from y, parent by x-range, self = count - children."""
    frames = _frames(svg)
    ys = sorted({f["y"] for f in frames}, reverse=True)
    for f in frames:
        f["depth"] = ys.index(f["y"])
        f["children"] = 0
    by_depth: dict[int, list[dict]] = {}
    for f in frames:
        by_depth.setdefault(f["depth"], []).append(f)
    for f in frames:
        if f["depth"] == 0:
            f["path"] = ()
            continue
        parents = [p for p in by_depth[f["depth"] - 1] if p["x"] - 0.02 <= f["x"] and f["x"] + f["w"] <= p["x"] + p["w"] + 0.02]
        assert len(parents) == 1, f
        f["parent"] = parents[0]
        parents[0]["children"] += f["count"]
    stacks = {}
    for f in sorted(frames, key=lambda fr: fr["depth"]):
        if f["depth"]:
            f["path"] = f["parent"]["path"] + (f["name"],)
        if f["count"] - f["children"] and f["depth"]:
            stacks[f["path"]] = f["count"] - f["children"]
    return stacks


def test_svg_is_well_formed_xml_with_the_interactive_parts():
    svg = render_svg(parse_folded(FOLDED), title="server (pid 42)")
    root = ET.fromstring(svg.encode("utf-8"))
    assert root.tag == f"{SVG_NS}svg"
    assert root.get("onload") == "init(evt)"
    scripts = root.findall(f".//{SVG_NS}script")
    assert len(scripts) == 1
    for needed in ("function init(", "function zoom(", "function unzoom(", "function search(", "mouseover"):
        assert needed in scripts[0].text
    ids = {e.get("id") for e in root.iter() if e.get("id")}
    assert {"frames", "details", "unzoom", "search", "matched", "title"} <= ids
    assert root.find(f".//{SVG_NS}text[@id='title']").text == "server (pid 42)"


def test_counts_read_back_from_the_svg_equal_the_input():
    prof = parse_folded(FOLDED)
    svg = render_svg(prof, style=Style(min_width=0))
    assert _stacks_from_svg(svg) == prof.stacks
    root = next(f for f in _frames(svg) if f["name"] == "all")
    assert root["count"] == prof.total() == 166


def test_widths_are_proportional_to_samples():
    svg = render_svg(parse_folded(FOLDED), style=Style(width=1200))
    frames = {f["name"]: f for f in _frames(svg)}
    per_sample = frames["all"]["w"] / 166
    assert frames["all"]["w"] == pytest.approx(1200 - 20, abs=0.01)
    assert frames["forward (model.py:12)"]["w"] == pytest.approx(120 * per_sample, abs=0.01)


def test_hostile_frame_names_are_escaped_and_come_back_as_text():
    prof = Profile()
    for i, name in enumerate(HOSTILE):
        prof.add(["main", name], 10 + i)
    svg = render_svg(prof, title="<script>alert('t')</script>", subtitle="a & b")
    root = ET.fromstring(svg.encode("utf-8"))
    assert len(root.findall(f".//{SVG_NS}script")) == 1
    assert svg.count("<script") == 1
    assert "alert(1)</script>" not in svg.replace("&lt;script&gt;alert(1)&lt;/script&gt;", "")
    names = {f["name"] for f in _frames(svg)}
    expected = {clean_frame(n)[0] for n in HOSTILE}
    assert {"new\\x0aline", "&amp\\x3b", "<script>alert(1)</script>"} <= expected
    assert expected <= names
    assert root.find(f".//{SVG_NS}text[@id='title']").text == "<script>alert('t')</script>"


def test_bidi_controls_in_frame_names_cannot_reorder_the_graph_or_its_counts():
    """A target naming a function 'forward\u202e' would show its sample count and share reversed in the
    details line ("(120 samples, 60.00%)" read right to left) and in the diff's panel."""
    bidi = ["forward\u202e", "\u2067tokenize\u2069", "x\u200fy", "a\u061cb", "\u202dltr\u202c"]
    prof = Profile()
    for i, name in enumerate(bidi):
        prof.add(["main", name], 10 + i)
    svg = render_svg(prof, title="t")
    ET.fromstring(svg.encode("utf-8"))
    assert not re.search("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]", svg)
    names = {f["name"] for f in _frames(svg)}
    assert {"forward\\u202e", "\\u2067tokenize\\u2069", "x\\u200fy"} <= names
    diff = export_diff(prof, Profile({("main", bidi[0]): 50}), "svg").data.decode()
    assert not re.search("[\u202a-\u202e\u2066-\u2069]", diff)


def test_any_title_subtitle_or_panel_line_gives_well_formed_xml():
    """xml_escape is total: what XML 1.0 cannot carry at all (NUL, C0 controls, lone surrogates, U+FFFE) is
    shown as an escape, never written, so a title from anywhere cannot make the browser refuse the file."""
    nasty = "t\x00i\x01t\x1bl\ud800e\ufffe \u202e<b>&"
    svg = render_svg(Profile({("main", "f"): 3}), title=nasty, subtitle=nasty)
    root = ET.fromstring(svg.encode("utf-8"))
    title = root.find(f".//{SVG_NS}text[@id='title']").text
    assert title == "t\\x00i\\x01t\\x1bl\\ud800e\\ufffe \\u202e<b>&"
    assert xml_escape("tab\tnew\nline") == "tab\tnew\nline"


def test_xml_escape_covers_both_quote_kinds():
    assert xml_escape("<a href=\"x\" title='y'>&</a>") == "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;"


def test_narrow_frames_are_merged_away_and_the_svg_stays_bounded():
    prof = Profile()
    prof.add(["main", "hot"], 1_000_000)
    for i in range(20_000):
        prof.add(["main", "cold", f"leaf{i}"], 1)
    svg = render_svg(prof)
    frames = _frames(svg)
    assert len(frames) < 10
    assert not any(f["name"].startswith("leaf") for f in frames)
    assert "20,000 frames narrower than the minimum width merged away with their callees" in svg
    assert next(f for f in frames if f["name"] == "all")["count"] == 1_020_000
    assert len(svg) < 20_000
    unbounded = render_svg(prof, style=Style(min_width=0, max_frames=100))
    assert len(_frames(unbounded)) == 100


def test_labels_fit_their_boxes():
    long = "long_function_name_" * 5
    # 300 of 1300 samples: a box wide enough for part of the long name; 1 of 1001: too narrow for any label.
    for samples, truncated in ((300, True), (1, False)):
        frames = {f["name"]: f for f in _frames(render_svg(parse_folded(f"a;{long} {samples}\na;b 1000\n")))}
        assert set(frames) == {"all", "a", "b", long}
        for f in frames.values():
            assert len(f["label"]) * 12 * 0.59 <= max(f["w"], 0) + 0.01
        assert frames["b"]["label"] == "b"
        label = frames[long]["label"]
        if truncated:
            assert label.endswith("..") and len(label) > 10 and long.startswith(label[:-2]), label
        else:
            assert label == ""


def test_colours_are_stable_per_name_and_kernel_frames_differ():
    assert palette_color("forward") == palette_color("forward")
    assert palette_color("forward") != palette_color("backward")
    assert palette_color("do_idle_[k]").startswith("rgb(2")
    with pytest.raises(ValueError, match="'neon'"):
        palette_color("x", "neon")
    with pytest.raises(ValueError, match="'neon'"):
        render_svg(Profile({("a",): 1}), palette="neon")


def test_style_rejects_bad_geometry():
    with pytest.raises(ValueError, match="width.*50"):
        Style(width=50)
    with pytest.raises(ValueError, match="panel_width.*1150"):
        Style(width=1200, panel_width=1150)


def test_empty_profile_renders_an_empty_graph():
    svg = render_svg(Profile())
    ET.fromstring(svg.encode())
    assert _frames(svg) == []


# A harness appended to the SVG drives its own script in a real browser: clicks a frame, searches,
# hovers, and writes what it saw into the DOM, which chromium --dump-dom prints.
HARNESS = r"""
window.addEventListener("load", function () { setTimeout(function () {
  var out = {};
  try {
    out.inited = fgframes.length;
    var target = null;
    for (var i = 0; i < fgframes.length; i++) { if (fgframes[i].name === "serve (server.py:40)") { target = fgframes[i]; } }
    target.rect.dispatchEvent(new MouseEvent("click", {bubbles: true}));
    out.zoom_width = parseFloat(target.rect.getAttribute("width"));
    out.hidden = [];
    out.parents = [];
    for (var j = 0; j < fgframes.length; j++) {
      if (fgframes[j].g.classList.contains("hide")) { out.hidden.push(fgframes[j].name); }
      if (fgframes[j].g.classList.contains("parent")) { out.parents.push(fgframes[j].name); }
    }
    search("^(forward|do_idle)");
    out.matched = document.getElementById("matched").textContent;
    target.rect.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
    out.details = document.getElementById("details").textContent;
    unzoom();
    out.unzoomed_width = parseFloat(target.rect.getAttribute("width"));
    out.hostile_label = fgframes.filter(function (f) { return f.name.indexOf("alert") >= 0; })[0].text.textContent;
  } catch (e) { out.error = String(e); }
  var t = document.createElementNS("http://www.w3.org/2000/svg", "text");
  t.setAttribute("id", "harness-result");
  t.textContent = JSON.stringify(out);
  document.documentElement.appendChild(t);
}, 0); });
"""


@pytest.mark.browser
def test_zoom_search_and_details_work_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium")
    if browser is None:
        pytest.fail("chromium is missing; 'make setup' installs Debian's chromium for browser tests")
    prof = parse_folded(FOLDED + "MainThread;<script>alert(1)</script> 34\n")
    svg = render_svg(prof, style=Style(min_width=0))
    path = tmp_path / "flame.svg"
    path.write_text(svg.replace("</svg>\n", f"<script type=\"text/ecmascript\"><![CDATA[{HARNESS}]]></script></svg>\n"))
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'chrome'}",
         "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
        check=False, capture_output=True, text=True, timeout=120)
    found = re.search(r'<text id="harness-result">(.*?)</text>', proc.stdout)
    assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(html.unescape(found.group(1)))
    assert "error" not in result, result
    assert result["inited"] == len(_frames(svg)) == 8
    assert result["zoom_width"] == pytest.approx(1180)
    assert set(result["hidden"]) == {"swapper", "do_idle_[k]", "<script>alert(1)</script>"}
    assert set(result["parents"]) == {"all", "MainThread"}
    assert result["matched"] == f"Matched: {100 * (120 + 9) / 200:.1f}%"
    assert result["details"] == "serve (server.py:40) (157 samples, 78.50%)"
    assert result["unzoomed_width"] == pytest.approx(1180 * 157 / 200, abs=0.01)
    assert result["hostile_label"].startswith("<script>")



@pytest.mark.parametrize("seed", range(30))
def test_random_hostile_profiles_read_back_from_the_svg(seed):
    prof = random_hostile_profile(seed)
    svg = render_svg(prof, style=Style(min_width=0))
    assert svg.count("<script") == 1
    assert _stacks_from_svg(svg) == prof.stacks
