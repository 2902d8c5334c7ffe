"""The status page and its JSON twin show targets, source health and the latest window."""

from analysis.snapshot import TargetStatus
from dashboards.app import create_app


def test_page_lists_target_sources_and_figures(client):
    html = client.get("/").get_data(as_text=True)
    assert "server" in html and "4242" in html
    assert "unsupported" in html and "no gc_collect_main" in html
    assert "50.0 / 120.0 ms" in html  # p50 / p99
    assert "py-spy exited: boom" in html


def test_json_status_matches_state(client):
    data = client.get("/api/status").get_json()
    latest = data["latest"]["server"]
    assert latest["p99_ms"] == 120.0
    assert latest["syscalls"] == 150
    assert latest["gc_collections"] == 3
    assert latest["cpu_percent"] == 40.0
    assert {s["source"] for s in data["sources"]} == {"syscalls", "gc"}


def test_untrusted_target_names_are_escaped(state):
    state.set_target(TargetStatus(name="<script>alert(1)</script>", pid=1, state="gone", since=0.0))
    client = create_app({"STATE": state}).test_client()
    html = client.get("/").get_data(as_text=True)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_no_state_yet_is_503_not_a_crash():
    client = create_app().test_client()
    assert client.get("/").status_code == 503
    resp = client.get("/api/status")
    assert resp.status_code == 503 and "not started" in resp.get_json()["error"]


def test_windows_endpoint_rejects_bad_arguments(state):
    class Store:
        def windows(self, **kw):
            return []

    client = create_app({"STATE": state, "STORE": Store()}).test_client()
    assert client.get("/api/windows?limit=abc").status_code == 400
    assert client.get("/api/windows?limit=0").status_code == 400
    resp = client.get("/api/windows?since=yesterday")
    assert resp.status_code == 400 and "'yesterday'" in resp.get_json()["error"]
    assert client.get("/api/windows?since=1&until=2").status_code == 200


def test_an_over_matching_regex_is_shown_on_the_page_and_in_metrics(state, client):
    from agent.targets import Skipped

    state.set_skipped({"workload": Skipped(matched=25, not_allowed=20, over_limit=3, max_targets=16)})
    page = client.get("/").get_data(as_text=True)
    assert "target workload: matched 25 processes; not watched: 20 owned by users not in allowed_users, " \
           "3 over max_targets (16)" in page
    text = client.get("/metrics").get_data(as_text=True)
    assert 'infersight_target_processes_skipped{reason="not_allowed_user",target="workload"} 20.0' in text
    assert 'infersight_target_processes_skipped{reason="max_targets",target="workload"} 3.0' in text
    assert 'infersight_target_processes_matched{target="workload"} 25.0' in text


def test_credentials_in_urls_are_never_shown(state, client):
    from analysis.health import Health
    from analysis.snapshot import TargetStatus

    state.set_target(TargetStatus(name="vllm", pid=7, state="watching", since=1.0,
                                  detail="python -m vllm --upstream https://bob:hunter2@10.1.1.1/v1"))
    state.set_health("latency:vllm", Health(name="latency", state="failed", error_count=3,
                                            reason="latency endpoint http://bob:hunter2@h:8000/metrics unreachable",
                                            detail={"url": "http://bob:hunter2@h:8000/metrics"}))
    for path in ("/", "/api/status"):
        text = client.get(path).get_data(as_text=True)
        assert "hunter2" not in text and "***@h:8000/metrics" in text, path


def test_the_syscall_our_gc_probe_causes_is_named_as_ours(state, client):
    from analysis.window import SyscallReading
    from tests.dashboards.conftest import make_window

    w = make_window()
    w.syscalls = SyscallReading(counts={"uretprobe": 900, "futex": 10})
    state.record_window(w)
    assert "uretprobe (infersight&#39;s GC probe) 900" in client.get("/").get_data(as_text=True)


def test_readings_a_window_lacks_say_not_measured_never_zero(bare_client):
    import re

    page = bare_client.get("/").get_data(as_text=True)
    native = page[page.index("<h3>native"):]
    native = native[:native.index("</section>")]
    for label in ("GC", "TCP retransmits", "run-queue p99", "latency p50 / p99", "requests", "Python samples"):
        row = re.search(rf"<dt>{re.escape(label)}</dt><dd>(.*?)</dd>", native, re.S)
        assert row and "not measured" in row.group(1) and not re.search(r"\b0\b", row.group(1)), (label, row)
    assert "7" in re.search(r"<dt>syscalls</dt><dd>(.*?)</dd>", native, re.S).group(1)
    assert "not a Python interpreter" in native, "the reason is shown beside it"


def test_clients_latency_shows_beside_the_servers_and_is_not_measured_without_delivery(client):
    from agent.state import AgentState
    from analysis.window import DeliveryReading, LatencyReading
    from tests.dashboards.conftest import make_window

    assert "clients p50 / p99" in client.get("/").get_data(as_text=True)
    assert client.get("/api/status").get_json()["latest"]["server"]["client_p99_ms"] is None
    state = AgentState()
    w = make_window()
    w.latency = LatencyReading(p50_seconds=0.05, p99_seconds=0.1, requests=100, request_rate=20.0,
                               buckets={"0.05": 50.0, "0.1": 50.0, "0.5": 0.0, "+Inf": 0.0})
    w.delivery = DeliveryReading(replies=100, retransmitted=20,
                                 buckets={"0.05": 80.0, "0.1": 0.0, "0.5": 20.0, "+Inf": 0.0})
    state.record_window(w)
    latest = create_app({"STATE": state}).test_client().get("/api/status").get_json()["latest"]["server"]
    assert 400 < latest["client_p99_ms"] <= 600 and latest["replies_retransmitted_percent"] == 20.0
    assert "20.0 % of replies retransmitted" in create_app({"STATE": state}).test_client().get("/").get_data(
        as_text=True)
