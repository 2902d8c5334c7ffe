"""A bounded hypothesis fuzz of the agent's HTTP API on loopback: no 500, no traceback, whatever is asked."""

import http.client
import time
import urllib.parse

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.alerts.service import AlertService
from agent.config import Config
from agent.daemon import WebServer
from agent.detection import DetectionSnapshot, TargetFinding
from agent.metrics import build_registry
from agent.state import AgentState, TargetStatus
from agent.store import Store
from analysis.regression import Cause, Regression
from analysis.window import LatencyReading, OffCpuReading, StackReading, Window
from dashboards.app import create_app

REGRESSION_ID = "server-1015"
# Every route of the app (its url_map, plus /metrics beside it) with the query keys it reads: a request names
# those far more often than it would by chance, so each route's checks are reached, not only its 404.
ROUTES: dict[str, tuple[str, ...]] = {
    "/": (),
    "/api/": (),
    "/api/status": (),
    "/api/alerts": (),
    "/api/overview": (),
    "/api/targets": (),
    "/api/windows": ("target", "since", "until", "limit"),
    "/api/members": ("target", "minutes"),
    "/api/flamegraph": ("target", "kind", "format", "from", "to"),
    "/api/flamegraph/diff": ("target", "kind", "format", "from", "to", "baseline_from", "baseline_to"),
    "/api/flamegraph/tree": ("target", "kind", "from", "to", "baseline_from", "baseline_to"),
    "/api/series": ("target", "range", "from", "to", "points"),
    "/api/offcpu": ("target", "range", "from", "to", "points"),
    "/api/regressions": ("target", "open", "limit"),
    "/api/regressions/{}": (),
    "/api/changes": ("target", "since", "until", "limit"),
    "/api/changes/{}": (),
    "/api/changes/{}/report": (),
    "/debug/pprof/profile": ("target", "kind", "seconds"),
    "/targets/{}": (),
    "/regressions": (),
    "/regressions/{}": (),
    "/flamegraph": ("target", "kind", "minutes", "from", "to", "baseline_from", "baseline_to"),
    "/static/{}": (),
    "/metrics": (),
}
NAMED = ["server", "other", "active", "idle", "offcpu", "svg", "folded", "pprof", "json", "speedscope", "15m", "1h",
         "24h", "7d", "1", "true", REGRESSION_ID, "style.css", "js/common.js", "../../../etc/passwd", "%2e%2e/x"]
HOSTILE = ["<script>", "\x00", "\ud800", "", " ", "a" * 400]
# Numbers as a careless parser takes them: the first four pass str.isdigit() and int() refuses them (a 500 once,
# for ²); float() takes the next ones, which are not finite.
HOSTILE_NUMBERS = ["²", "¹", "⁴", "①", "٣", "1e400", "-1e400", "nan", "inf", "-inf", "-0", " 1", "0x10", "1_000",
                   "9" * 400]
NUMERIC_KEYS = {"limit", "since", "until", "from", "to", "baseline_from", "baseline_to", "points", "seconds", "minutes"}
WORDS = st.one_of(st.text(max_size=20), st.sampled_from(NAMED), st.sampled_from(HOSTILE))
NUMBERS = st.one_of(st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.floats(900.0, 1200.0).map(repr), st.integers(0, 2000).map(str),
                    st.sampled_from(HOSTILE_NUMBERS), st.sampled_from(HOSTILE_NUMBERS))
# Each key mostly gets the kind of value it reads (so the checks behind the first are reached), sometimes the other.
VALUES = {key: st.one_of(NUMBERS, WORDS) if key in NUMERIC_KEYS else st.one_of(WORDS, st.sampled_from(HOSTILE_NUMBERS))
          for keys in ROUTES.values() for key in keys + ("x",)}


@st.composite
def requests(draw) -> tuple[str, list[tuple[str, str]]]:
    route = draw(st.sampled_from(sorted(ROUTES)))
    segment = draw(st.one_of(WORDS, NUMBERS))
    path = route.format(urllib.parse.quote(segment, safe="/", errors="surrogatepass")) if "{}" in route else route
    keys = draw(st.lists(st.sampled_from(ROUTES[route] + ("x",)), max_size=5))
    return path, [(key, draw(VALUES[key])) for key in keys]


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory):
    store = Store.open(tmp_path_factory.mktemp("fuzz") / "store")
    for i in range(12):
        store.add_window(Window(target="server", pid=100, start=1000.0 + 5 * i, end=1005.0 + 5 * i,
                                stacks=StackReading(active={"main;<b>decode</b>": 3 + i}, idle={"main;wait": 2},
                                                    rate_hz=49.0),
                                offcpu=OffCpuReading(seconds=0.5, stacks={"schedule;futex_wait": 100}),
                                latency=LatencyReading(p50_seconds=0.1, p99_seconds=0.3, requests=10,
                                                       request_rate=2.0)))
    regression = Regression(id=REGRESSION_ID, target="server", pid=100, opened_at=1015.0, severity="critical",
                            score=9.0, causes=[Cause("gc", 5.0, "GC pause <b>41 ms/s</b>", 0.041, 0.0008)],
                            baseline_start=1000.0, baseline_end=1010.0)
    store.save_regression(regression)
    findings = DetectionSnapshot(findings={"server": TargetFinding(
        target="server", state="regression", score=9.0, expected={"p50": 0.1, "p99": 0.3}, regression=regression,
        window_end=1060.0)})
    state = AgentState()
    state.set_target(TargetStatus(name="server", pid=100, state="watching", since=1000.0))
    clock = {"now": 1100.0}
    # Virtual time for the pprof endpoint: a fuzzed seconds=300 must not hold the run for 5 minutes.
    app = create_app({"STATE": state, "STORE": store, "REGISTRY": build_registry(state), "INTERVAL_SECONDS": 1.0,
                      "FINDINGS": lambda: findings, "ALERTS": AlertService(Config(), store, on_error=print).view,
                      "CLOCK": lambda: clock["now"], "SLEEP": lambda s: clock.__setitem__("now", clock["now"] + s)})
    web = WebServer(app, "127.0.0.1", 0)
    web.start()
    yield web.url
    web.stop()
    store.close()


@settings(max_examples=1500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=requests(), method=st.sampled_from(["GET", "GET", "GET", "POST", "HEAD"]))
# Each once answered 500: a Unicode digit passes str.isdigit() and then fails int().
@example(case=("/api/windows", [("limit", "²")]), method="GET")
@example(case=("/debug/pprof/profile", [("seconds", "²"), ("target", "server")]), method="GET")
@example(case=("/api/series", [("target", "server"), ("points", "²")]), method="GET")
@example(case=("/api/regressions", [("limit", "٣")]), method="GET")
@example(case=("/api/flamegraph/tree", [("target", "server"), ("from", "1e400")]), method="GET")
def test_agent_api_never_answers_500(agent_url, case, method):
    path, params = case
    query = urllib.parse.urlencode(params, errors="surrogatepass")
    host, port = agent_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    began = time.monotonic()
    try:
        conn.request(method, f"{path}?{query}" if query else path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status < 500, (method, path, query, resp.status, body[:300])
    assert b"Traceback" not in body and b"File \"/" not in body, (path, query)
    assert time.monotonic() - began < 10, (path, query)


def test_every_route_is_fuzzed():
    app = create_app({"TESTING": True})
    rules = {rule.rule for rule in app.url_map.iter_rules()}
    fuzzed = {route.replace("{}", "<rid>" if "regressions/" in route or "changes/" in route else "<name>" if "targets/" in route
                            else "<path:filename>") for route in ROUTES} - {"/metrics"}
    assert rules == fuzzed, f"routes not fuzzed: {sorted(rules - fuzzed)}; gone: {sorted(fuzzed - rules)}"


def test_every_hostile_number_in_every_numeric_key_of_every_route(agent_url):
    """The table beside the fuzz: each hostile number alone in each numeric key a route reads, so a parser that
    regresses is caught on every run, not on the runs that happen to draw it."""
    host, port = agent_url.removeprefix("http://").split(":")
    failed = []
    for route, keys in sorted(ROUTES.items()):
        for key in sorted(set(keys) & NUMERIC_KEYS):
            for value in HOSTILE_NUMBERS:
                query = urllib.parse.urlencode({"target": "server", key: value})
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                try:
                    conn.request("GET", f"{route.format(REGRESSION_ID)}?{query}")
                    resp = conn.getresponse()
                    body = resp.read()
                finally:
                    conn.close()
                if resp.status >= 500 or b"Traceback" in body:
                    failed.append((route, key, value, resp.status))
    assert not failed, failed
