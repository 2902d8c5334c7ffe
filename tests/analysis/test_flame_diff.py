"""Differential flame graphs: normalised by totals, red growth / blue shrinkage, movers against ground truth."""

import html
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from analysis.flamegraph.diff import diff, diff_color, render_diff_svg
from analysis.flamegraph.folded import format_diff_folded, parse_diff_folded
from analysis.flamegraph.profile import Profile

SVG_NS = "{http://www.w3.org/2000/svg}"


def _frames(svg: str) -> dict[str, dict]:
    root = ET.fromstring(svg.encode("utf-8"))
    out = {}
    for g in root.find(f".//{SVG_NS}g[@id='frames']").findall(f"{SVG_NS}g"):
        title = g.find(f"{SVG_NS}title").text
        name, _, detail = title.rpartition(" (")
        rect = g.find(f"{SVG_NS}rect")
        out[name] = {"count": int(detail.split(" ", 1)[0].replace(",", "")), "fill": rect.get("fill"),
                     "w": float(rect.get("width")), "detail": detail}
    return out


def _panel(svg: str) -> list[str]:
    root = ET.fromstring(svg.encode("utf-8"))
    return [t.text for t in root.find(f".//{SVG_NS}g[@id='panel']").findall(f"{SVG_NS}text")]


def test_same_shape_at_different_totals_is_no_change():
    base = Profile({("m", "a"): 100, ("m", "b"): 300})
    cur = Profile({("m", "a"): 1000, ("m", "b"): 3000})  # a longer range, same behaviour
    d = diff(base, cur)
    assert all(m.self_delta == pytest.approx(0) and m.total_delta == pytest.approx(0) for m in d.movers(50))
    fills = {f["fill"] for f in _frames(render_diff_svg(d)).values()}
    assert fills == {"rgb(250,250,250)"}


def test_growth_is_red_shrinkage_blue_and_the_movers_match_ground_truth():
    # Baseline: a and b take half the samples each. Current (3x the samples): a 80%, b 20%.
    base = Profile({("main", "a"): 500, ("main", "b"): 500})
    cur = Profile({("main", "a"): 2400, ("main", "b"): 600})
    d = diff(base, cur)
    movers = {m.name: m for m in d.movers()}
    assert movers["a"].self_delta == pytest.approx(30.0)
    assert movers["b"].self_delta == pytest.approx(-30.0)
    assert movers["main"].total_delta == pytest.approx(0.0)
    assert [m.name for m in d.movers(2)] == ["a", "b"]
    frames = _frames(render_diff_svg(d))
    assert frames["a"]["fill"] == "rgb(255,0,0)"
    assert frames["b"]["fill"] == "rgb(0,0,255)"
    assert frames["main"]["fill"] == "rgb(250,250,250)"
    assert frames["a"]["count"] == 2400  # widths come from the current profile
    assert "80.00% now, 50.00% before; total +30.00 pp, self +30.00 pp" in frames["a"]["detail"]


def test_colour_intensity_follows_the_size_of_the_change():
    assert diff_color(10, 10) == "rgb(255,0,0)"
    assert diff_color(5, 10) == "rgb(255,105,105)"
    assert diff_color(-5, 10) == "rgb(105,105,255)"
    assert diff_color(0, 10) == "rgb(250,250,250)"


def test_stacks_gone_from_the_current_range_are_listed_as_movers_not_drawn():
    base = Profile({("main", "old_path"): 400, ("main", "kept"): 600})
    cur = Profile({("main", "kept"): 900, ("main", "new_path"): 100})
    d = diff(base, cur)
    svg = render_diff_svg(d)
    frames = _frames(svg)
    assert "old_path" not in frames
    assert frames["new_path"]["fill"].startswith("rgb(255,")
    movers = {m.name: m for m in d.movers()}
    assert movers["old_path"].self_delta == pytest.approx(-40.0)
    assert movers["new_path"].self_delta == pytest.approx(10.0)
    assert movers["kept"].self_delta == pytest.approx(30.0)
    panel = _panel(svg)
    assert panel[0] == "Largest movers"
    assert panel[2].split() == ["-40.00", "-40.00", "old_path"]
    assert panel[3].split() == ["+30.00", "+30.00", "kept"]


def test_recursion_does_not_push_an_inclusive_share_past_100():
    cur = Profile({("f", "f", "f"): 10})
    (mover,) = [m for m in diff(Profile({("g",): 10}), cur).movers() if m.name == "f"]
    assert mover.current_total == pytest.approx(100.0)


def test_movers_by_total_ranks_callers():
    base = Profile({("main", "handler", "x"): 10, ("main", "handler", "y"): 10, ("main", "idle"): 80})
    cur = Profile({("main", "handler", "x"): 30, ("main", "handler", "y"): 30, ("main", "idle"): 40})
    top = diff(base, cur).movers(1, by="total")[0]
    assert (top.name, round(top.total_delta, 6)) in {("handler", 40.0), ("idle", -40.0)}
    with pytest.raises(ValueError, match="'cum'"):
        diff(base, cur).movers(by="cum")


def test_hostile_names_in_the_diff_and_its_panel_are_escaped():
    evil = "<script>alert(1)</script>"
    svg = render_diff_svg(diff(Profile({("m", evil): 1}), Profile({("m", evil): 5, ("m", "x"): 5})),
                          title="<b>t</b>")
    assert svg.count("<script") == 1
    assert evil in _frames(svg)
    assert any(evil in line for line in _panel(svg))


def test_unit_mismatch_is_refused():
    with pytest.raises(ValueError, match="'microseconds'"):
        diff(Profile(unit="samples"), Profile(unit="microseconds"))


def test_diff_folded_and_diff_profile_agree():
    base = Profile({("m", "a"): 10, ("m", "b"): 30})
    cur = Profile({("m", "a"): 60, ("m", "b"): 20})
    before, after = parse_diff_folded(format_diff_folded(base, cur))
    d = diff(base, cur)
    assert {s: (c, b) for s, c, b in d.stacks} == {s: (after.stacks[s], before.stacks[s]) for s in after.stacks}


def _panel(svg: str) -> list[str]:
    root = ET.fromstring(svg.encode("utf-8"))
    (panel,) = [e for e in root.iter() if e.get("id") == "panel"]
    return [t.text for t in panel.iter() if t.text]


def test_empty_inputs_render_with_their_movers():
    nothing = diff(Profile(), Profile())
    assert nothing.movers() == []
    assert _panel(render_diff_svg(nothing)) == ["Largest movers", "   self   total  (pp)"]
    # Everything vanished: the one function lost its whole share, 100 percentage points.
    gone = diff(Profile({("a",): 3}), Profile())
    assert [(m.name, m.self_delta, m.total_delta) for m in gone.movers()] == [("a", -100.0, -100.0)]
    assert _panel(render_diff_svg(gone))[-1] == "-100.00 -100.00  a"


DIFF_HARNESS = r"""
window.addEventListener("load", function () { setTimeout(function () {
  var out = {};
  try {
    var a = fgframes.filter(function (f) { return f.name === "a"; })[0];
    a.rect.dispatchEvent(new MouseEvent("click", {bubbles: true}));
    out.zoom_width = parseFloat(a.rect.getAttribute("width"));
    unzoom();
    search("^b$");
    out.matched = document.getElementById("matched").textContent;
  } catch (e) { out.error = String(e); }
  var t = document.createElementNS("http://www.w3.org/2000/svg", "text");
  t.setAttribute("id", "harness-result");
  t.textContent = JSON.stringify(out);
  document.documentElement.appendChild(t);
}, 0); });
"""


@pytest.mark.browser
def test_diff_svg_zooms_within_the_graph_not_the_panel_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium")
    if browser is None:
        pytest.fail("chromium is missing; 'make setup' installs Debian's chromium for browser tests")
    d = diff(Profile({("main", "a"): 500, ("main", "b"): 500}), Profile({("main", "a"): 2400, ("main", "b"): 600}))
    svg = render_diff_svg(d)
    path = tmp_path / "diff.svg"
    path.write_text(svg.replace("</svg>\n", f"<script><![CDATA[{DIFF_HARNESS}]]></script></svg>\n"))
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'chrome'}",
         "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
        check=False, capture_output=True, text=True, timeout=120)
    found = re.search(r'<text id="harness-result">(.*?)</text>', proc.stdout)
    assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(html.unescape(found.group(1)))
    assert "error" not in result, result
    assert result["zoom_width"] == pytest.approx(1600 - 20 - 420)
    assert result["matched"] == "Matched: 20.0%"
