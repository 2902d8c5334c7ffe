"""A bounded hypothesis fuzz of the agent's HTTP API on loopback: no 500, no traceback, whatever is asked."""

import http.client
import time
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.daemon import WebServer
from agent.metrics import build_registry
from agent.state import AgentState, TargetStatus
from agent.store import Store
from analysis.window import OffCpuReading, StackReading, Window
from dashboards.app import create_app

PATHS = ["/", "/api/status", "/api/windows", "/api/targets", "/api/flamegraph", "/api/flamegraph/diff",
         "/debug/pprof/profile", "/metrics", "/nope", "/api/", "/static/style.css"]
KEYS = ["limit", "since", "until", "target", "kind", "format", "from", "to", "baseline_from", "baseline_to",
        "seconds", "x"]
VALUES = st.one_of(st.text(max_size=20), st.integers(-10**12, 10**12).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["server", "active", "idle", "offcpu", "svg", "folded", "pprof", "json",
                                    "speedscope", "²", "٣", "1e400", "-0", "", " 1", "<script>"]))


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory):
    store = Store.open(tmp_path_factory.mktemp("fuzz") / "store")
    for i in range(12):
        store.add_window(Window(target="server", pid=100, start=1000.0 + 5 * i, end=1005.0 + 5 * i,
                                stacks=StackReading(active={"main;<b>decode</b>": 3 + i}, idle={"main;wait": 2},
                                                    rate_hz=49.0),
                                offcpu=OffCpuReading(seconds=0.5, stacks={"schedule;futex_wait": 100})))
    state = AgentState()
    state.set_target(TargetStatus(name="server", pid=100, state="watching", since=1000.0))
    clock = {"now": 1100.0}
    # Virtual time for the pprof endpoint: a fuzzed seconds=300 must not hold the run for 5 minutes.
    app = create_app({"STATE": state, "STORE": store, "REGISTRY": build_registry(state), "INTERVAL_SECONDS": 1.0,
                      "CLOCK": lambda: clock["now"], "SLEEP": lambda s: clock.__setitem__("now", clock["now"] + s)})
    web = WebServer(app, "127.0.0.1", 0)
    web.start()
    yield web.url
    web.stop()
    store.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), params=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=5),
       method=st.sampled_from(["GET", "GET", "GET", "POST", "HEAD"]))
def test_agent_api_never_answers_500(agent_url, path, params, method):
    query = urllib.parse.urlencode(params)
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
