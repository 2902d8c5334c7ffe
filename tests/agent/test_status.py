"""`infersight status` prints what the agent says, with nothing a watched process wrote able to drive the terminal."""

import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.status import printable
from tests.conftest import REPO

# What a watched process controls ends up in reasons and errors: its command line, its error texts, its /metrics
# answer. Each of these would act on the terminal of whoever runs `infersight status`.
HOSTILE = {
    "clear screen, red": "\x1b[2J\x1b[31mall fine",
    "window title (OSC, BEL)": "\x1b]0;pwned\x07title",
    "hyperlink (OSC 8, ST)": "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "C1 CSI": "\x9b2Jc1",
    "bidi override": "ok \u202eevil\u202c end",
    "isolate": "\u2066x\u2069",
    "bell and backspace": "a\x07\x08b",
    "newline": "one\ntwo\r\nthree",
    "lone surrogate": "x\ud800y",
    "line separator": "a\u2028b",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_printable_keeps_no_control_or_format_character(text):
    out = printable(text)
    assert all(ch.isprintable() or ch == " " for ch in out), repr(out)
    assert "\x1b" not in out and "\x9b" not in out and "\n" not in out


def test_printable_leaves_ordinary_text_and_non_ascii_alone():
    assert printable("py-spy: cannot attach — pid 12 ü 日本 [ok] 50%") == "py-spy: cannot attach — pid 12 ü 日本 [ok] 50%"
    assert printable("\x1b[31mred\x1b[0m and \u202eevil") == "red and evil"


def _status_json() -> dict:
    summary = {"end": 1_800_000_000.0, "start": 1_799_999_995.0, "target": "w\x1b[2J", "pid": 7,
               **{k: None for k in ("p99_ms", "request_rate", "cpu_percent", "rss_mb", "syscalls", "offcpu_seconds",
                                    "gc_collections", "gc_pause_ms", "runqueue_p99_us", "tcp_retransmits",
                                    "python_samples", "gpu_percent")},
               "errors": {"latency": HOSTILE["hyperlink (OSC 8, ST)"]}}
    return {"uptime_seconds": 5, "windows_written": 1, "late_ticks": 0, "dropped_windows": 0,
            "targets": [{"name": "w", "state": HOSTILE["window title (OSC, BEL)"], "pid": 7}],
            "sources": [{"source": f"stacks:{i}", "state": "failed", "reason": text}
                        for i, text in enumerate(HOSTILE.values())],
            "latest": {"w": summary}}


NO_STORE = "this agent keeps no store"
NO_ALERTS = "this agent delivers no alerts"


@pytest.fixture
def fake_agent():
    answers = {"/api/status": (200, _status_json()), "/api/regressions": (503, {"error": NO_STORE}),
               "/api/alerts": (503, {"error": NO_ALERTS})}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            code, doc = answers[self.path.split("?")[0]]
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_status_prints_reasons_without_escape_sequences(fake_agent):
    # Fails before printable(): the reasons reached the terminal as sent (and the lone surrogate crashed print).
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "status", "--url", fake_agent], capture_output=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = proc.stdout.decode()
    lines = out.splitlines()
    # Nothing a reason held started a new line: agent, target, its regressions (not known here), sources, latest.
    assert len(lines) == 1 + 1 + 1 + len(HOSTILE) + 1, out
    assert f"  regressions: not known ({NO_STORE})" in lines
    for bad in ("\x1b", "\x9b", "\x07", "\x08", "\u202e", "\u2066", "\u2028", "\r"):
        assert bad not in out, f"{bad!r} reached the terminal"
    assert "source stacks:0: failed — all fine" in lines
    assert "target w: title (pid 7)" in lines
    assert lines[-1].endswith("errors: latency: click")
    # --json escapes everything itself: the same data, as JSON.
    raw = subprocess.run([sys.executable, "-m", "agent.cli", "status", "--json", "--url", fake_agent],
                         capture_output=True, timeout=60, cwd=REPO)
    assert raw.returncode == 0 and b"\x1b" not in raw.stdout
    assert json.loads(raw.stdout) == {**_status_json(), "open_regressions": None, "open_regressions_error": NO_STORE,
                                      "alerts": None, "alerts_error": NO_ALERTS}


def test_status_says_why_a_target_is_down():
    from agent.status import format_status

    data = {"uptime_seconds": 5, "windows_written": 1, "late_ticks": 0, "dropped_windows": 0, "sources": [],
            "latest": {}, "targets": [
                {"name": "gone", "state": "down", "pid": 7, "detail": "pid 7 killed by SIGKILL (signal 9) from pid 1 (x)",
                 "down": "pid 7 killed by SIGKILL (signal 9) from pid 1 (x)"},
                {"name": "deaf", "state": "watching", "pid": 8, "detail": "python serve.py",
                 "down": "pid 8 is alive but serves no one: nothing listens on its latency port for 2 windows"},
                {"name": "fine", "state": "watching", "pid": 9, "detail": "python serve.py", "down": None},
                {"name": "later", "state": "waiting", "pid": None, "detail": "no process matches 'x'"}]}
    lines = format_status(data).splitlines()
    assert "target gone: down (pid 7) — pid 7 killed by SIGKILL (signal 9) from pid 1 (x)" in lines
    assert ("target deaf: down (pid 8) — pid 8 is alive but serves no one: nothing listens on its latency port "
            "for 2 windows") in lines
    assert "target fine: watching (pid 9)" in lines
    assert "target later: waiting (pid None) — no process matches 'x'" in lines


def test_status_shows_a_cpu_only_hosts_gpu_neutrally():
    from agent.status import format_status

    data = {"uptime_seconds": 5, "windows_written": 1, "late_ticks": 0, "dropped_windows": 0, "latest": {},
            "targets": [], "sources": [{"source": "gpu:w", "state": "absent", "reason": "no GPU on this host"}]}
    assert "source gpu:w: absent — no GPU on this host" in format_status(data).splitlines()


def test_status_shows_each_targets_open_regression_and_its_alert(tmp_path):
    """A real page app over a real store and AlertService, real receivers (one accepts, one is down), and the real
    CLI: per target its open regression (id, cause, since) and its alert's state, then the outbox backlog."""
    import time

    from agent.alerts.service import AlertService
    from agent.config import config_from_dict
    from agent.state import AgentState
    from agent.store import Store
    from analysis.snapshot import TargetStatus
    from dashboards.app import create_app
    from tests.agent.alerts.conftest import Receiver, free_port, make_regression, say_opened, wait_for
    from tests.dashboards.browser import serve

    good = Receiver().start()
    conf = config_from_dict({"store_dir": str(tmp_path / "store"),
                             "alerts": {"group_wait_seconds": 0, "backoff_initial_seconds": 30},
                             "receivers": [{"name": "good", "url": good.url, "targets": ["a"]},
                                           {"name": "down", "url": f"http://127.0.0.1:{free_port()}/hook",
                                            "targets": ["b"]}]})
    store = Store.open(conf.store_dir)
    service = AlertService(conf, store)
    service.start()
    try:
        now = time.time()
        say_opened(service, make_regression("a-1", target="a", opened_at=now - 300, top="gc"))
        say_opened(service, make_regression("b-1", target="b", opened_at=now - 60, severity="critical", top="lock"))
        wait_for(lambda: good.accepted() and service.view()["receivers"][0]["last_error"] is not None,
                 what="one alert delivered, the other tried")
        state = AgentState()
        for name in ("a", "b", "c"):
            state.set_target(TargetStatus(name=name, pid=4242, state="watching", since=now - 600))
        app = create_app({"STATE": state, "STORE": store, "ALERTS": service.view, "CHECK_HOST": False})
        with serve(app) as url:
            proc = subprocess.run([sys.executable, "-m", "agent.cli", "status", "--url", url], capture_output=True,
                                  timeout=60, cwd=REPO, text=True)
    finally:
        service.stop()
        store.close()
        good.stop()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = {name: lines.index(f"target {name}: watching (pid 4242)") for name in ("a", "b", "c")}
    a_reg, a_alert = lines[at["a"] + 1], lines[at["a"] + 2]
    assert re.fullmatch(r"  regression a-1: gc, warning, open since \S+ \S+ UTC \([5-9] min\)", a_reg), a_reg
    assert a_alert == "  alert: firing, delivered", a_alert
    b_reg, b_alert = lines[at["b"] + 1], lines[at["b"] + 2]
    assert re.fullmatch(r"  regression b-1: lock, critical, open since \S+ \S+ UTC \(\d+ (s|min)\)", b_reg), b_reg
    assert b_alert == "  alert: firing, 1 pending (down)", b_alert
    assert lines[at["c"] + 1] == "  regression: none open"
    (outbox,) = [line for line in lines if line.startswith("alert outbox: ")]
    assert "down 1 pending (oldest " in outbox and "good 0 pending" in outbox, outbox
