"""The report: JSON round trip, clear errors for non-reports, the HTML with every chart drawn (also in Chromium)."""

import base64
import json
import re
import shlex
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from agent.cli import main
from agent.loadtest import html
from agent.loadtest.report import LoadTestReport, ReportError, from_dict, load, save
from analysis.capacity import Slo, StepFigures

GOOD_STACKS = {"scheduler;step (workload/scheduler.py:90);forward (workload/model.py:60)": 40,
               "scheduler;step (workload/scheduler.py:90);sample (workload/engine.py:80)": 10}
BAD_STACKS = {"scheduler;step (workload/scheduler.py:90);forward (workload/model.py:60)": 30,
              "scheduler;step (workload/scheduler.py:90);gc_hook (workload/faults.py:50)": 60}


def figures(index: int, rate: float, p95: float, repeat_of: int | None = None, **kw) -> StepFigures:
    ok = int(rate * 10)
    base = dict(index=index, offered_rps=rate, planned_s=10, duration_s=10, sent=ok, ok=ok, achieved_rps=rate,
                tokens_per_s=rate * 32, client_p50_s=p95 / 2, client_p95_s=p95, client_p99_s=p95 * 1.2,
                ttft_p50_s=0.02, ttft_p95_s=0.05, server_p95_s=p95 * 0.9, queue_waiting_mean=rate / 4,
                queue_waiting_max=rate / 2, running_mean=1.0, batch_mean=1.5, cpu_cores=rate / 10,
                busiest_thread_cores=rate / 11, busiest_thread_offcpu_share=0.3,
                offcpu_by_kind={"lock (futex)": 30.0, "poll (idle)": 1.0}, gc_pause_share=0.01 * rate,
                gc_collections_per_s=rate, runq_p99_us=1024.0, runq_wait_per_s=0.02 * rate,
                syscalls_per_request=300.0, ctx_switches_per_s=20 * rate, involuntary_ctx_switches_per_s=rate,
                retransmits=0, host_cpus=2, repeat_of=repeat_of)
    base.update(kw)
    return StepFigures(**base)


def report() -> LoadTestReport:
    steps = [figures(0, 2, 0.2), figures(1, 4, 0.3), figures(2, 8, 1.8, gc_pause_share=0.2),
             figures(3, 4, 0.33, repeat_of=1)]
    return LoadTestReport(url="http://127.0.0.1:8000", pid=4242, slo=Slo(1.0), schedule="2:10,4:10,8:10",
                          started=1_790_000_000.0, finished=1_790_000_040.0, steps=steps, label="gc",
                          flame_good=GOOD_STACKS, flame_bad=BAD_STACKS)


def test_round_trip_recomputes_knee_and_bottleneck(tmp_path):
    path = tmp_path / "r.json"
    save(report(), path)
    data = json.loads(path.read_text())
    assert data["knee"] == {"last_good": 1, "first_bad": 2, "reason": "p95 1800 ms > SLO 1000 ms", "found": True}
    assert data["bottleneck"]["resource"] == "GC"
    assert data["noise"]["client_p95_s"] == pytest.approx(0.03 / 0.315)
    again = load(path)
    assert again.steps == report().steps and again.slo == Slo(1.0) and again.flame_bad == BAD_STACKS


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    ('{"version": 7}', "not a version-1 load test report (version 7)"),
    ("[1, 2]", "not a version-1 load test report (version 'list')"),
    ('{"version": 1, "url": "x"}', "missing or has a bad field"),
])
def test_files_that_are_not_reports(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReportError, match=re.escape(message)):
        load(path)


def test_bad_slo_in_a_report_is_a_report_error():
    data = report().to_dict()
    data["slo"]["p95_s"] = 0
    with pytest.raises(ReportError, match="SLO p95 must be > 0"):
        from_dict(data)


def test_compare_cli_prints_the_table_and_one_line_for_a_bad_file(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save(report(), a)
    save(report(), b)
    assert main(["loadtest", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "max requests/s under SLO" in out and "gc -> gc: no difference beyond noise" in out
    assert main(["loadtest", "compare", str(a), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("infersight loadtest: cannot read")


def test_html_draws_every_chart_and_the_three_flame_graphs():
    page = html.render(report())
    charts = re.findall(r'<svg class="chart" id="([\w-]+)" data-points="(\d+)"', page)
    assert len(charts) == len(html.FIGURES)
    assert all(int(points) > 0 for _, points in charts), charts
    assert page.count('<img class="flame') == 3 and "data:image/svg+xml;base64," in page
    assert "Knee: 4 req/s offered" in page and "GC: the interpreter spent" in page
    gc_row = re.search(r"<tr><td class=l>GC</td><td>([\d.]+)</td><td>([\d.]+)</td>", page)
    assert gc_row and (gc_row[1], gc_row[2]) == ("0.80", "4.00")  # 4 % -> 20 % of wall against 5 %
    assert "http://" not in page.replace("http://127.0.0.1:8000", "").replace("http://www.w3.org/2000/svg", "")


def test_html_says_why_a_chart_is_empty():
    r = report()
    for s in r.steps:
        s.gc_pause_share, s.gc_collections_per_s = None, None
        s.unmeasured["gc"] = "unsupported: no libpython"
    page = html.render(r)
    assert 'id="chart-gc" data-points="0"' in page and "not measured: unsupported: no libpython" in page


# Load test reports only: a sweep's summary (docs/loadtest/*sweep*.json) has no knee of its own.
RECORDED = [p for p in sorted((Path(__file__).resolve().parents[2] / "docs" / "loadtest").glob("*.json"))
            if "knee" in json.loads(p.read_text())]


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_a_recorded_reports_derived_fields_are_what_this_code_computes(path):
    """Knee, bottleneck and noise are stored for readers but recomputed on load; a stored copy that differs
    was judged by older code (gc-fault.json once said 'CPU contention' while RESULTS.md said GC)."""
    stored = json.loads(path.read_text())
    current = json.loads(json.dumps(load(path).to_dict()))
    for part in ("knee", "bottleneck", "noise"):
        assert stored[part] == current[part], (
            f"{path.name}: the stored {part} is stale; re-save it with agent.loadtest.report's save(load(path), path) "
            "and check docs/loadtest/RESULTS.md against it")
    assert stored == current


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_results_md_names_what_each_recorded_report_names(path):
    rows = [line for line in (path.parent / "RESULTS.md").read_text().splitlines()
            if line.startswith(f"| `{path.name}`")]
    assert len(rows) == 1, f"RESULTS.md has no table row for {path.name}"
    named = rows[0].rstrip(" |").rsplit("|", 1)[1].replace("*", "").strip()
    resource = load(path).bottleneck().resource or "none"
    assert named.startswith(resource), f"RESULTS.md says {named!r}; the report names {resource!r}"


@pytest.fixture
def browser(tmp_path):
    pytest.importorskip("selenium", reason="selenium is in the test extra: pip install -e '.[test]'")
    from tests.dashboards.browser import chromium

    with chromium(tmp_path) as b:
        yield b


def _whole_page(browser) -> None:
    """Grow the window to the page, so a screenshot holds every chart, not the first screen."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(int(height) + 40, 8000))


@pytest.mark.browser
def test_report_renders_every_chart_and_flame_graph(browser, tmp_path):
    from tests.dashboards.browser import screenshot

    page = tmp_path / "report.html"
    page.write_text(html.render(report()))
    browser.get(page.as_uri())
    drawn = browser.execute_script("""
        return Array.from(document.querySelectorAll('svg.chart')).map(s => ({
            id: s.id, points: s.querySelectorAll('circle.point').length,
            lines: s.querySelectorAll('polyline.series').length,
            width: s.getBoundingClientRect().width}));""")
    assert len(drawn) == len(html.FIGURES)
    assert all(c["points"] > 0 and c["lines"] > 0 and c["width"] > 100 for c in drawn), drawn
    flames = browser.execute_script("""
        return Array.from(document.querySelectorAll('img.flame')).map(i => i.complete && i.naturalWidth);""")
    assert len(flames) == 3 and all(w and w > 500 for w in flames), flames
    assert browser.find_element("id", "bottleneck").text.startswith("GC:")
    _whole_page(browser)
    # Kept under build/screenshots (INFERSIGHT_SCREENSHOTS moves it) for a person to look at.
    shot = screenshot(browser, "loadtest-report")
    assert len(shot.read_bytes()) > 20_000


PROBE_CHARTS = {"gc": "gc", "offcpu": "offcpu", "runqueue": "runq", "syscalls": "syscalls", "tcp": "retrans"}


def _expected_points(r: LoadTestReport, chart_id: str, spec: list) -> int:
    """Circles a chart must draw: one per step (repeats too) whose figure the recording holds."""
    if chart_id == "offcpu":
        kinds = {k for s in r.steps for k in s.offcpu_by_kind}
        return len(kinds) * sum(1 for s in r.steps if s.offcpu_by_kind)
    return sum(1 for _, attr, _ in spec for s in r.steps
               if (attr(s) if callable(attr) else getattr(s, attr)) is not None)


@pytest.mark.browser
@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_a_recorded_report_draws_a_point_for_every_figure_it_measured(browser, tmp_path, path):
    """A "not measured" placeholder counts as drawn only for a figure the recording did not measure."""
    from tests.dashboards.browser import screenshot

    recorded = load(path)
    page = tmp_path / "recorded.html"
    page.write_text(html.render(recorded))
    browser.get(page.as_uri())
    drawn = browser.execute_script("""
        return Object.fromEntries(Array.from(document.querySelectorAll('svg.chart')).map(s => [s.id, {
            points: s.querySelectorAll('circle.point').length, empty: s.querySelectorAll('text.empty').length}]));""")
    assert len(drawn) == len(html.FIGURES)
    for chart_id, _, _, spec in html.FIGURES:
        want, got = _expected_points(recorded, chart_id, spec), drawn[f"chart-{chart_id}"]
        if want:
            assert got == {"points": want, "empty": 0}, (chart_id, want, got)
        else:
            assert got == {"points": 0, "empty": 1}, (chart_id, got)
    specs = {chart_id: spec for chart_id, _, _, spec in html.FIGURES}
    for probe in recorded.settings.get("probes", []):  # what a probe that ran measures must be drawn
        chart_id = PROBE_CHARTS[probe]
        assert _expected_points(recorded, chart_id, specs[chart_id]) > 0, (probe, chart_id)
    _whole_page(browser)
    screenshot(browser, f"loadtest-recorded-{path.stem}")


@pytest.mark.parametrize("argv", [
    ["--url", "http://127.0.0.1:8731", "--pid", "23177", "--schedule", "1:10,2:10", "--slo-p95", "2", "--label",
     "cache A", "-o", "out dir/a.json"],
    ["--url", "http://h:1", "--target", "srv", "--config", "a.toml", "--no-probes", "--no-pyspy", "--all-steps",
     "--server-max-batch", "4", "--model", "m", "--timeout", "12.5", "--repeats", "0", "--html", "r.html"],
    ["--sweep", "max-batch=1,4", "--server-arg=--no-cache", "--probes", "gc,offcpu", "--pyspy-rate", "99"],
    ["--url", "http://h:1", "--pid", "5", "--children"],
    ["--url", "http://h:1", "--port", "8000"],
    ["--url", "http://h:1", "--unit", "vllm.service"],
    ["--url", "http://h:1", "--cgroup", "system.slice/x.service"],
    ["--url", "http://h:1", "--container", "3f2a"],
])
def test_the_command_line_saved_in_a_report_parses_back_to_the_same_run(argv):
    from agent.cli import build_parser
    from agent.loadtest.command import command_line

    args = build_parser().parse_args(["loadtest", *argv])
    line = command_line(args)
    assert line.startswith("infersight loadtest ")
    again = build_parser().parse_args(shlex.split(line)[1:])
    assert vars(again) == vars(args), line


def test_target_names_resolve_through_the_config(tmp_path, capsys):
    config = tmp_path / "agent.toml"
    config.write_text('[[targets]]\nname = "srv"\npidfile = "srv.pid"\n')
    assert main(["loadtest", "--url", "http://127.0.0.1:1", "--config", str(config), "--target", "nope"]) == 2
    assert "no target 'nope' in the config (known: srv)" in capsys.readouterr().err
    assert main(["loadtest", "--url", "http://127.0.0.1:1", "--config", str(config), "--target", "srv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "target 'srv' is not running" in err[0]


HOSTILE_TEXT = ['<script>alert(1)</script>', '"><img src=x onerror=alert(2)>', "' onmouseover='alert(3)",
                "</title><svg onload=alert(4)>", "&amp;&lt;", "a\u202eb"]


def test_hostile_strings_stay_text_in_the_html_report():
    """What the server under test answers (error kinds, unmeasured reasons), its frame names, and the operator's
    label and URL are escaped wherever they are written: the parsed page has only the report's own tags and no
    event-handler attribute, and each hostile string reads back as text."""
    hostile = "|".join(HOSTILE_TEXT)
    steps = [figures(0, 2, 0.2, errors={hostile: 1}, offcpu_by_kind={hostile: 3.0}),
             figures(1, 4, 0.3, unmeasured={"gc_pause_share": hostile}, gc_pause_share=None),
             figures(2, 8, 1.8, errors={"500": 2})]
    stacks = {f"main;{name} (srv.py:1)": 10 + i for i, name in enumerate(HOSTILE_TEXT)}
    rep = LoadTestReport(url=f"http://127.0.0.1:8000/{hostile}", pid=1, slo=Slo(1.0), schedule=hostile,
                         started=1_790_000_000.0, finished=1_790_000_040.0, steps=steps, label=hostile,
                         collection_problems={hostile: hostile}, flame_good=stacks,
                         flame_bad={**stacks, "main;gc (srv.py:2)": 90})
    page = html.render(rep)

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: set[str] = set()
            self.handlers: list[tuple[str, str]] = []
            self.text: list[str] = []

        def handle_starttag(self, tag, attrs) -> None:
            self.tags.add(tag)
            self.handlers += [(tag, k) for k, _ in attrs if k.startswith("on")]

        def handle_data(self, data) -> None:
            self.text.append(data)

    parsed = Tags()
    parsed.feed(page)
    assert parsed.handlers == []
    assert parsed.tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table", "tr",
                           "th", "td", "span", "div", "img", "ul", "li", "svg", "rect", "text", "line", "g",
                           "polyline", "circle", "br"}
    text = "".join(parsed.text)
    assert text.count(hostile) >= 4  # title, heading, schedule, problems (and the error kinds)
    # The flame graphs ride in <img> (where SVG scripts never run), and their frame names are text there too.
    for src in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page):
        svg = ET.fromstring(base64.b64decode(src))
        assert len(svg.findall(".//{http://www.w3.org/2000/svg}script")) == 1


def test_a_step_field_of_the_wrong_type_or_a_flame_that_is_not_a_table_is_a_report_error():
    # Fails before msgspec read reports: a string count was taken as it was (and broke the knee later), and a
    # flame entry that is not a table raised AttributeError instead of one line.
    data = report().to_dict()
    data["steps"][1]["sent"] = "many"
    with pytest.raises(ReportError, match=re.escape("$.steps[1].sent")):
        from_dict(data)
    data = report().to_dict()
    data["flame"] = "stacks"
    with pytest.raises(ReportError, match="flame is not a table"):
        from_dict(data)


def test_background_traffic_travels_with_the_report_and_adds_to_the_knee(tmp_path):
    import dataclasses

    from agent.loadtest.command import summary
    from agent.loadtest.server_metrics import BackgroundLoad

    rep = dataclasses.replace(report(), background=BackgroundLoad(2.0, 5.0, "vllm:request_success"))
    path = tmp_path / "r.json"
    save(rep, path)
    again = load(path)
    assert again.background == rep.background
    lines = summary(again).splitlines()
    assert lines[0] == ("WARNING: the server already served 2.00 req/s of other traffic (vllm:request_success over "
                        "5 s before step 1): each step's load at the server was its offered rate plus that")
    assert lines[1].startswith("knee: 4 req/s offered (+ background = 6.00 req/s at the server) (")
    assert "8 req/s (+ background = 10.00 req/s at the server) breaks the SLO" in lines[1]
    page = html.render(again)
    assert 'id="background" class="warning"' in page and "6.00 req/s at the server" in page
    # A report from before the field: no background line, no key written back.
    assert "background" not in report().to_dict() and not summary(report()).startswith("WARNING")
