"""The page's regression banner and /api/regressions over a real store and the live findings."""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from agent.detection import DetectionSnapshot, TargetFinding
from agent.metrics import build_registry
from agent.store import Store
from analysis.regression import Cause, FunctionShift, Regression
from dashboards.app import create_app

HOSTILE = '<script>alert(1)</script>"onerror="x'


def regression(closed_at=None, target="server") -> Regression:
    return Regression(id=f"{target}-1000", target=target, pid=4242, opened_at=1000.0, closed_at=closed_at,
                      severity="critical", score=8.5, baseline_start=100.0, baseline_end=900.0,
                      causes=[Cause("gc", 6.0, "GC pause 41 ms/s vs 0.8 ms/s baseline (x51)", 0.041, 0.0008),
                              Cause("compute", 1.5, f"CPU per token 2.1 ms vs 1.9 ms in {HOSTILE}")],
                      functions=[FunctionShift(f"fault.py:{HOSTILE}", 0.01, 0.40)])


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "store") as s:
        yield s


def make_client(state, store, findings):
    app = create_app({"STATE": state, "STORE": store, "REGISTRY": build_registry(state), "TESTING": True,
                      "FINDINGS": findings})
    return app.test_client()


def test_open_regression_banner_names_cause_evidence_and_links_the_diff(state, store):
    snap = DetectionSnapshot(findings={"server": TargetFinding("server", "regression", 8.5, {"p99": 0.2},
                                                               regression(), 1005.0)})
    page = make_client(state, store, lambda: snap).get("/")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert "Latency regression on server" in text and "(critical)" in text
    assert "GC pause 41 ms/s vs 0.8 ms/s baseline (x51)" in text
    assert "<script>alert(1)" not in text and '"onerror="' not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    start = text.index("differential flame graph") - 300
    href = html.unescape(text[start:].split('<a href="')[1].split('"')[0])
    assert urlsplit(href).path == "/api/flamegraph/diff"
    q = parse_qs(urlsplit(href).query)
    assert q["baseline_from"] == ["100"] and q["baseline_to"] == ["900"] and q["from"] == ["970"]
    assert q["target"] == ["server"]


def test_no_open_regression_is_said_plainly(state, store):
    snap = DetectionSnapshot(findings={"server": TargetFinding("server", "warmup", None, {}, None, 1005.0)})
    text = make_client(state, store, lambda: snap).get("/").get_data(as_text=True)
    assert "No open latency regression" in text and "server: learning its baseline" in text
    assert "Latency regression on" not in text


def test_api_lists_stored_regressions_with_bounds(state, store):
    store.save_regression(regression(closed_at=1100.0))
    store.save_regression(regression(target="other"))
    client = make_client(state, store, None)
    found = client.get("/api/regressions").get_json()
    assert sorted(r["target"] for r in found) == ["other", "server"]
    only_open = client.get("/api/regressions?open=1").get_json()
    assert [r["id"] for r in only_open] == ["other-1000"]
    server = client.get("/api/regressions?target=server").get_json()
    assert server[0]["top_cause"] == "gc" and server[0]["open_seconds"] == 100.0
    assert server[0]["flamegraph_url"].startswith("/api/flamegraph/diff?")
    for bad in ("0", "501", "x", "²", "-1"):
        r = client.get(f"/api/regressions?limit={bad}")
        assert r.status_code == 400 and "limit must be an integer in 1..500" in r.get_json()["error"]


def test_a_cpu_contention_regression_names_its_neighbour_on_the_page_and_in_its_json(state, store):
    """The culprit as the detector's own path names it (analysis.culprits.named over an episode's windows) reaches the
    page's banner, the regression's JSON (structured, for tools) and survives the store, its hostile text escaped."""
    from analysis import culprits

    samples = [{"culprits": {"wait": 1.0, "duration": 5.0, "top": [
        {"pid": 9911, "comm": "python3", "cmdline": f"python3 hog.py {HOSTILE}", "user": "bob", "seconds": 0.71},
        {"pid": 812, "comm": "rsyslogd", "cmdline": "/usr/sbin/rsyslogd", "user": "root", "seconds": 0.05}]}}] * 3
    cause = culprits.named(Cause("cpu_contention", 6.0, "run-queue wait per CPU second 2.1 vs 0.3"), samples)
    reg = Regression(id="server-2000", target="server", pid=4242, opened_at=2000.0, closed_at=None,
                     severity="critical", score=8.5, baseline_start=100.0, baseline_end=1900.0, causes=[cause])
    store.save_regression(reg)
    snap = DetectionSnapshot(findings={"server": TargetFinding("server", "regression", 8.5, {"p99": 0.2}, reg, 2005.0)})
    client = make_client(state, store, lambda: snap)
    text = client.get("/").get_data(as_text=True)
    assert "pid 9911" in text and "python3 hog.py" in text and "bob" in text
    assert "<script>alert(1)" not in text
    data = client.get("/api/regressions/server-2000").get_json()
    top = data["causes"][0]
    assert top["label"] == "cpu_contention" and "pid 9911" in top["evidence"]
    assert [(n["pid"], n["user"]) for n in top["neighbours"]] == [(9911, "bob"), (812, "root")]
    assert top["neighbours"][0]["share"] == pytest.approx(0.71)
