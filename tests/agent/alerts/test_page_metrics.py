"""What the operator sees: /metrics series, the status page's Alerts section and /api/alerts, with no secret."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.alerts.service import AlertService
from agent.config import config_from_dict
from agent.metrics import build_registry
from agent.state import AgentState
from agent.store import Store
from dashboards.app import create_app
from tests.agent.alerts.conftest import say_opened

SECRET = "page-secret-value"


@pytest.fixture
def delivered(tmp_path: Path, receivers, make_reg, monkeypatch):
    monkeypatch.setenv("PAGE_SECRET", SECRET)
    good = receivers()
    down = receivers(answer=lambda n: (500, 0.0))
    conf = config_from_dict({"store_dir": str(tmp_path / "store"),
                             "alerts": {"group_wait_seconds": 0, "backoff_initial_seconds": 30},
                             "receivers": [{"name": "good", "url": good.url, "hmac_secret_env": "PAGE_SECRET"},
                                           {"name": "down", "url": down.url + "?token=" + SECRET}]})
    store = Store.open(conf.store_dir)
    service = AlertService(conf, store)
    service.start()
    say_opened(service, make_reg("page-1"))
    deadline = time.monotonic() + 10
    while (not good.accepted() or not down.arrivals) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    yield page_client(service, store)
    service.stop()
    store.close()


def page_client(service: AlertService, store: Store):
    state = AgentState()
    registry = build_registry(state)
    registry.register(service.collector())
    return create_app({"STATE": state, "STORE": store, "REGISTRY": registry, "ALERTS": service.view,
                       "TESTING": True}).test_client()


def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_series(delivered) -> None:
    text = delivered.get("/metrics").get_data(as_text=True)
    assert SECRET not in text
    samples = metric_samples(text)
    assert samples[("infersight_alert_notifications_total", (("receiver", "good"), ("status", "sent")))] == 1
    assert samples[("infersight_alert_notifications_total", (("receiver", "down"), ("status", "retried")))] == 1
    assert samples[("infersight_alert_notifications_total", (("receiver", "down"), ("status", "sent")))] == 0
    assert samples[("infersight_alert_outbox_pending", (("receiver", "down"),))] == 1
    assert samples[("infersight_alert_outbox_pending", (("receiver", "good"),))] == 0
    assert samples[("infersight_alert_outbox_oldest_seconds", (("receiver", "good"),))] == 0
    assert 0 < samples[("infersight_alert_outbox_oldest_seconds", (("receiver", "down"),))] < 30


def test_status_page_alerts_section(delivered) -> None:
    html = delivered.get("/").get_data(as_text=True)
    assert SECRET not in html
    section = html.split("<h2>Alerts</h2>", 1)[1]
    assert 'id="alert-receivers"' in section and 'id="regression-page-1"' in section
    assert "HTTP 500 from http://127.0.0.1:" in section
    assert "good firing: sent" in section and "down firing: pending" in section


def test_api_alerts(delivered) -> None:
    resp = delivered.get("/api/alerts")
    assert resp.status_code == 200 and SECRET not in resp.get_data(as_text=True)
    by = {r["name"]: r for r in resp.get_json()["receivers"]}
    assert (by["good"]["sent"], by["down"]["pending"]) == (1, 1)


def test_expired_notifications_show_in_metrics_and_on_the_page(tmp_path: Path, receivers, make_reg) -> None:
    busy = receivers(answer=lambda n: (503, 0.0))
    conf = config_from_dict({"store_dir": str(tmp_path / "store"),
                             "alerts": {"group_wait_seconds": 0, "retry_max_age_seconds": 1,
                                        "backoff_initial_seconds": 0.2, "backoff_max_seconds": 0.2},
                             "receivers": [{"name": "busy", "url": busy.url}]})
    with Store.open(conf.store_dir) as store:
        service = AlertService(conf, store)
        service.start()
        try:
            say_opened(service, make_reg("gone-1"))
            deadline = time.monotonic() + 15
            while service.counters.snapshot().get(("busy", "expired")) != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            client = page_client(service, store)
            samples = metric_samples(client.get("/metrics").get_data(as_text=True))
            html = client.get("/").get_data(as_text=True)
        finally:
            service.stop()
    assert busy.arrivals, "the receiver was never tried"
    total = "infersight_alert_notifications_total"
    assert samples[(total, (("receiver", "busy"), ("status", "expired")))] == 1
    assert samples[(total, (("receiver", "busy"), ("status", "retried")))] == len(busy.arrivals)
    assert samples[(total, (("receiver", "busy"), ("status", "sent")))] == 0
    assert samples[("infersight_alert_outbox_pending", (("receiver", "busy"),))] == 0
    section = html.split("<h2>Alerts</h2>", 1)[1]
    row = next(r for r in section.split("<tr") if "<td>busy</td>" in r)
    cells = re.findall(r"<td>(.*?)</td>", row, re.S)
    header = ["receiver", "kind", "url", "pending", "oldest pending", "sent", "failed", "expired", "last error"]
    shown = dict(zip(header, cells, strict=True))
    assert (shown["pending"], shown["sent"], shown["failed"], shown["expired"]) == ("0", "0", "0", "1")
    assert "HTTP 503 from http://127.0.0.1:" in shown["last error"] and "gave up" in shown["last error"]
    assert 'class="state-failed"' in row and "busy firing: expired" in section


def test_without_alerting_the_page_says_so() -> None:
    client = create_app({"STATE": AgentState(), "TESTING": True}).test_client()
    assert "alert delivery is not running" in client.get("/").get_data(as_text=True)
    assert client.get("/api/alerts").status_code == 503
