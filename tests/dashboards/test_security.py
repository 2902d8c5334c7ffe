"""What a browser sends on behalf of another site's page is refused; curl, Prometheus and the page itself are served."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.daemon import WebServer
from agent.metrics import build_registry
from agent.state import AgentState
from analysis.health import Health
from analysis.snapshot import TargetStatus
from dashboards.app import create_app
from tests.dashboards.browser import chromium, console_errors, wait_for
from tests.dashboards.synthetic import fill

CROSS = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
NAVIGATE = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}


@pytest.mark.parametrize("path", ["/", "/api/status", "/metrics", "/targets/server"])
@pytest.mark.parametrize("headers", [{}, {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"},
                                     {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"},
                                     {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"}],
                         ids=["curl", "the page's own fetch", "typed address", "own origin"])
def test_curl_prometheus_and_the_page_itself_are_served(client, path, headers):
    assert client.get(path, headers=headers).status_code == 200


@pytest.mark.parametrize(("path", "headers", "says"), [
    ("/debug/pprof/profile?seconds=300", CROSS, "cross-site request"),
    ("/api/status", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}, "cross-site request"),
    ("/metrics", CROSS, "cross-site request"),
    ("/static/style.css", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "style"},
     "cross-site request"),
    # Another port of 127.0.0.1 is the same site: any local user's server, the workload's.
    ("/api/status", {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}, "same-site request"),
    ("/api/status", {"Origin": "http://evil.example"}, "Origin 'http://evil.example'"),
    ("/api/status", {"Origin": "http://localhost:8000"}, "another origin"),
    ("/metrics", {"Origin": "null"}, "Origin 'null'"),
    ("/api/status", {"Origin": "https://localhost"}, "another origin"),
    # A link elsewhere may open a page, never an API or a profile; a frame is no top-level navigation.
    ("/api/status", NAVIGATE, "cross-site request"),
    ("/debug/pprof/profile?seconds=300", NAVIGATE, "cross-site request"),
    ("/", {**NAVIGATE, "Sec-Fetch-Dest": "iframe"}, "cross-site request"),
])
def test_what_another_sites_page_sends_is_refused_in_one_line(client, path, headers, says):
    resp = client.get(path, headers=headers)
    assert resp.status_code == 403, resp.data
    error = resp.get_json()["error"]
    assert says in error and "\n" not in error and error.startswith("refused: ")


@pytest.mark.parametrize("path", ["/", "/targets/server", "/regressions", "/flamegraph"])
def test_a_link_clicked_on_another_site_opens_the_page(client, path):
    # An alert's link in a web chat, a Grafana panel's link: a top-level navigation, served.
    assert client.get(path, headers=NAVIGATE).status_code == 200


# ---- in a real browser ------------------------------------------------------------------------------------------


class _Recorder:
    """WSGI middleware that notes each answer's path, status and Sec-Fetch-Site (what arrived, and what it got)."""

    def __init__(self, app) -> None:
        self.app, self.seen, self.lock = app, [], threading.Lock()

    def __call__(self, environ, start_response):
        def start(status, headers, *exc):
            with self.lock:
                self.seen.append((environ["PATH_INFO"], int(status[:3]), environ.get("HTTP_SEC_FETCH_SITE")))
            return start_response(status, headers, *exc)
        return self.app(environ, start)

    def answered(self, path: str) -> list[tuple[str, int, str | None]]:
        with self.lock:
            return [s for s in self.seen if s[0] == path]


def _hostile_page(agent: str) -> bytes:
    # What any site open in a browser on the host can do: no-cors fetches and images that each hold a profile slot
    # for up to 300 s, and a CORS read of the API.
    return f"""<!doctype html><title>a page elsewhere</title>
<script>
addEventListener("load", () => {{
  new Image().src = "{agent}/debug/pprof/profile?seconds=60&target=other";
  fetch("{agent}/debug/pprof/profile?seconds=60&target=server", {{mode: "no-cors"}}).catch(() => {{}});
  fetch("{agent}/api/status").then(r => r.text()).then(t => window.__read = t, e => window.__refused = String(e));
}});
</script>
<a id="go" href="{agent}/">the agent's page</a>""".encode()


@pytest.fixture
def hostile_site():
    pages: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], pages
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("site", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site (another port)"])
def test_a_page_elsewhere_in_chromium_cannot_hold_profile_slots_or_read_the_api(tmp_path, hostile_site, site):
    # Fails before SameOrigin: the two profiles were served, holding both slots for 60 s, and the page's own
    # profile pull got 429 meanwhile.
    now = time.time()
    store = fill(tmp_path / "store", now, 600)
    fill(tmp_path / "store", now, 600, target="other").close()
    state = AgentState()
    state.set_target(TargetStatus(name="server", pid=4242, state="watching", since=now - 600))
    state.set_health("syscalls", Health(name="syscalls", state="running"))
    state.record_window(store.latest("server"))
    app = create_app({"STATE": state, "STORE": store, "REGISTRY": build_registry(state), "INTERVAL_SECONDS": 5.0})
    recorder = _Recorder(app)
    web = WebServer(recorder, "127.0.0.1", 0)
    web.start()
    port, pages = hostile_site
    pages["/"] = _hostile_page(web.url)
    try:
        with chromium(tmp_path) as browser:
            browser.get(f"http://{site}:{port}/")
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline and not (len(recorder.answered("/debug/pprof/profile")) == 2
                                                       and recorder.answered("/api/status")):
                time.sleep(0.2)
            pulls, reads = recorder.answered("/debug/pprof/profile"), recorder.answered("/api/status")
            assert [s[1] for s in pulls] == [403, 403], f"profile pulls from {site}:{port} were answered {pulls}"
            assert [s[1] for s in reads] == [403], reads
            assert app.config["PROFILE_GATE"].in_use == 0
            wait_for(browser, "return window.__refused || window.__read", what="the page's read to settle")
            assert browser.execute_script("return window.__read") is None
            # The agent's page, opened by a link there, works: its own requests are same-origin.
            console_errors(browser)
            browser.find_element("id", "go").click()
            agent_port = web.url.rsplit(":", 1)[1]
            wait_for(browser, f"return location.port === '{agent_port}' && "
                              "document.querySelectorAll('#targets tr').length > 1", what="the status page's targets table")
            assert "4242" in browser.find_element("id", "targets").text
            assert console_errors(browser) == []
            own = recorder.answered("/")
            assert own and own[-1][1:] == (200, "cross-site" if site == "localhost" else "same-site")
    finally:
        web.stop()
        store.close()
