"""Every page in real headless Chromium over a store of synthetic windows: no console error, charts with real
points that zoom together, a flame graph that zooms and searches, a banner that arrives without a reload, and
hostile strings that never execute."""

from __future__ import annotations

import time

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from agent.detection import DetectionSnapshot, TargetFinding
from agent.metrics import build_registry
from agent.state import AgentState
from analysis.health import Health
from analysis.snapshot import TargetStatus
from dashboards.app import create_app
from tests.dashboards.browser import chromium, console_errors, screenshot, serve, wait_for
from tests.dashboards.synthetic import HOSTILE, fill, regression

pytestmark = pytest.mark.browser

# Set when the world is built, not at import: the page's ranges end at the browser's present, and in a full run
# this module runs many minutes after collection (an import-time NOW left 485 of 720 windows in the last hour).
NOW = time.time()
SLOW_FROM = NOW - 1200


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    global NOW, SLOW_FROM
    NOW = time.time()
    SLOW_FROM = NOW - 1200
    tmp = tmp_path_factory.mktemp("page")
    store = fill(tmp / "store", NOW, 2 * 3600, slow_from=SLOW_FROM)
    store.save_regression(regression("server", NOW - 5400, closed_at=NOW - 5000))
    store.save_regression(regression("server", SLOW_FROM + 60))
    state = AgentState()
    state.set_target(TargetStatus(name="server", pid=4242, state="watching", since=NOW - 7200,
                                  detail=f"python serve.py --tag {HOSTILE}"))
    state.set_health("syscalls", Health(name="syscalls", state="running"))
    state.set_health("gc", Health(name="gc", state="failed", reason=f"uprobe failed: {HOSTILE}"))
    last = store.latest("server")
    last.errors["stacks"] = f"py-spy exited: {HOSTILE}"
    state.record_window(last)
    holder = {"snap": DetectionSnapshot(findings={
        "server": TargetFinding("server", "healthy", 1.0, {"p50": 0.05, "p99": 0.12}, None, NOW)})}
    app = create_app({"STATE": state, "STORE": store, "REGISTRY": build_registry(state), "INTERVAL_SECONDS": 5.0,
                      "FINDINGS": lambda: holder["snap"]})
    with serve(app) as url, chromium(tmp) as browser:
        yield {"url": url, "browser": browser, "holder": holder, "store": store}
    store.close()


def no_xss(browser) -> None:
    assert browser.execute_script("return window.__xss === undefined"), "a hostile string executed"
    assert browser.execute_script("return document.querySelectorAll('img[src=\"x\"], script:not([src])').length") == 0
    srcs = browser.execute_script("return [...document.scripts].map(s => new URL(s.src).pathname)")
    assert all(s.startswith("/static/") for s in srcs), srcs


def test_every_page_loads_without_console_errors(world):
    b, url = world["browser"], world["url"]
    rid = world["store"].regressions(open_only=True)[0].id
    pages = {
        "overview": ("/", "return document.querySelectorAll('#target-cards .card svg path').length > 0"),
        # Two hours of windows: the page opens at the smallest range that holds them.
        "target": ("/targets/server", "return document.getElementById('target').dataset.loaded === '6h'"),
        "regressions": ("/regressions", "return document.querySelectorAll('#regression-list a').length >= 2"),
        "regression": (f"/regressions/{rid}", "return document.getElementById('flame').dataset.drawn === '1'"),
        "flamegraph": ("/flamegraph?target=server", "return document.getElementById('flame').dataset.drawn === '1'"),
    }
    console_errors(b)
    for name, (path, ready) in pages.items():
        b.get(url + path)
        wait_for(b, ready, what=f"{name} page drawn")
        time.sleep(0.5)
        screenshot(b, f"page-{name}")
        assert console_errors(b) == [], name
        no_xss(b)
    # The regression page names its causes with their evidence and links every export.
    b.get(f"{url}/regressions/{rid}")
    wait_for(b, "return document.getElementById('flame').dataset.drawn === '1'")
    text = b.find_element(By.ID, "regression").text
    assert "GC pause 10 ms/s vs 1 ms/s baseline (x10)" in text and HOSTILE in text
    hrefs = [a.get_attribute("href") for a in b.find_elements(By.CSS_SELECTOR, "#export-links a")]
    assert {f"format={f}" for f in ("folded", "svg", "speedscope", "pprof")} <= {h.split("&")[-1] for h in hrefs}


def test_charts_draw_real_points_and_zoom_together(world):
    b, url = world["browser"], world["url"]
    b.get(url + "/targets/server?range=1h")
    wait_for(b, "return document.getElementById('target').dataset.loaded === '1h'")
    stats = b.execute_script("""return window.infersightCharts.map(u => ({
        points: u.data[0].length, drawn: u.data.slice(1).some(s => s.some(v => v !== null)),
        min: u.scales.x.min, max: u.scales.x.max}))""")
    assert len(stats) == 9
    assert all(s["points"] >= 500 for s in stats) and all(s["drawn"] for s in stats), stats
    kinds = b.execute_script("return window.infersightKindChart.series.map(s => s.label)")
    assert "lock (futex)" in kinds  # the synthetic windows block in schedule;futex_wait_queue
    # Drag across the middle of the first chart: every chart takes the same, narrower time range.
    over = b.find_elements(By.CSS_SELECTOR, "#chart-latency .u-over")[0]
    w = over.size["width"]
    ActionChains(b).move_to_element_with_offset(over, -w // 4, 0).click_and_hold() \
        .move_by_offset(w // 3, 0).release().perform()
    zoomed = wait_for(b, """const s = window.infersightCharts.map(u => [u.scales.x.min, u.scales.x.max]);
        return s[0][1] - s[0][0] < %f ? s : null""" % ((stats[0]["max"] - stats[0]["min"]) * 0.6),
                      what="the first chart zoomed")
    assert all(z == pytest.approx(zoomed[0]) for z in zoomed), zoomed
    kind_x = b.execute_script("const u = window.infersightKindChart; return [u.scales.x.min, u.scales.x.max]")
    assert kind_x == pytest.approx(zoomed[0])
    screenshot(b, "target-zoomed")
    assert console_errors(b) == []


def test_flame_graph_zooms_on_click_and_search_highlights(world):
    b, url = world["browser"], world["url"]
    b.get(url + "/flamegraph?target=server&minutes=60")
    wait_for(b, "return document.getElementById('flame').dataset.drawn === '1'")
    width_of = """return [...document.querySelectorAll('#flame g')].filter(g => g.querySelector('title') &&
        g.querySelector('title').textContent.startsWith(arguments[0]))
        .map(g => parseFloat(g.querySelector('rect').getAttribute('width')))[0]"""
    before = wait_for(b, width_of.replace("arguments[0]", "'tokenize'"), what="the tokenize frame")
    frame = [g for g in b.find_elements(By.CSS_SELECTOR, "#flame g")
             if g.find_element(By.TAG_NAME, "title").get_attribute("textContent").startswith("tokenize")][0]
    ActionChains(b).move_to_element(frame).click().perform()
    full = b.execute_script("return document.querySelector('#flame svg').getAttribute('width')")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and b.execute_script(width_of, "tokenize") < float(full) * 0.9:
        time.sleep(0.2)
    assert b.execute_script(width_of, "tokenize") >= float(full) * 0.9 > before
    screenshot(b, "flame-zoomed")
    b.find_element(By.ID, "flame-reset").click()
    time.sleep(0.5)
    box = b.find_element(By.ID, "flame-search")
    box.send_keys("decode")
    highlighted = wait_for(b, """return [...document.querySelectorAll('#flame rect')]
        .filter(r => ['rgb(230, 0, 230)', '#E600E6', '#e600e6'].includes(r.getAttribute('fill') || r.style.fill)).length""",
                           what="highlighted frames")
    assert highlighted >= 1
    box.send_keys("(")  # not a regular expression: text
    time.sleep(0.5)
    screenshot(b, "flame-search")
    assert console_errors(b) == []
    no_xss(b)


def test_flame_graph_diff_mode_colours_growth(world):
    b, url = world["browser"], world["url"]
    start, end = int(SLOW_FROM), int(NOW)
    b.get(f"{url}/flamegraph?target=server&from={start}&to={end}&baseline_from={start - 3600}&baseline_to={start - 60}")
    wait_for(b, "return document.getElementById('flame').dataset.drawn === '1'")
    fill = b.execute_script("""const g = [...document.querySelectorAll('#flame g')].find(g => g.querySelector('title')
        && g.querySelector('title').textContent.startsWith('decode')); return g.querySelector('rect').getAttribute('fill')""")
    red, green, blue = (int(v) for v in fill[4:-1].split(","))
    assert red == 255 and green < 255, fill  # decode's own samples grew: red
    screenshot(b, "flame-diff")
    assert console_errors(b) == []


def test_regression_banner_arrives_without_a_reload(world):
    b, url, holder = world["browser"], world["url"], world["holder"]
    holder["snap"] = DetectionSnapshot(findings={
        "server": TargetFinding("server", "healthy", 1.0, {"p50": 0.05, "p99": 0.12}, None, NOW)})
    b.get(url + "/")
    wait_for(b, "return document.querySelector('#regressions .no-regression')")
    b.execute_script("window.__sameDocument = true")
    assert "No open latency regression" in b.find_element(By.ID, "regressions").text
    opened = world["store"].regressions(open_only=True)[0]
    holder["snap"] = DetectionSnapshot(findings={
        "server": TargetFinding("server", "regression", 8.5, {"p50": 0.05, "p99": 0.12}, opened, NOW)})
    wait_for(b, "return document.querySelector('#regressions .banner')", timeout=20, what="the banner")
    assert b.execute_script("return window.__sameDocument === true"), "the page reloaded"
    text = b.find_element(By.ID, "regressions").text
    assert "Latency regression on server (critical) since" in text and "likely gc" in text
    assert "GC pause 10 ms/s vs 1 ms/s baseline (x10)" in text and HOSTILE in text
    assert f"functions that grew: decode {HOSTILE} (30% → 55%)" in text
    card = b.find_element(By.CSS_SELECTOR, "#target-cards .card").text
    assert "regression open" in card
    screenshot(b, "overview-regression")
    assert console_errors(b) == []
    no_xss(b)


def test_a_fresh_agent_opens_at_the_range_that_holds_its_minutes(world, tmp_path):
    """Five minutes of windows fill a third of the 15m range the page opens at, not a twelfth of an hour."""
    now = time.time()
    store = fill(tmp_path / "fresh", now, 300)
    app = create_app({"STORE": store, "INTERVAL_SECONDS": 5.0})
    b = world["browser"]
    try:
        with serve(app) as url:
            b.get(url + "/targets/server")
            wait_for(b, "return document.getElementById('target').dataset.loaded === '15m'",
                     what="the target page drawn at 15m")
            span = b.execute_script("""const u = window.infersightCharts[0];
                const i = u.data[1].findIndex(v => v !== null);
                return {min: u.scales.x.min, max: u.scales.x.max, first: i < 0 ? null : u.data[0][i]}""")
            assert span["first"] is not None, span
            assert span["max"] - span["min"] == pytest.approx(900, abs=120), span
            assert (span["max"] - span["first"]) / (span["max"] - span["min"]) >= 0.25, span
            active = [e.text for e in b.find_elements(By.CSS_SELECTOR, "button.range")]
            assert active == ["15m", "1h", "6h", "24h", "7d"]
            screenshot(b, "target-fresh-15m")
            assert console_errors(b) == []
    finally:
        store.close()
