"""The exporter against a real OTLP/HTTP receiver on loopback: metrics every interval, regression records in
order, and a receiver that is down, refuses, answers 500 or drips costs nothing but a counted failure."""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.alerts.config import AlertsConfig
from agent.alerts.service import AlertService
from agent.config import config_from_dict
from agent.metrics import build_registry
from agent.otlp.config import OtlpConfig, settings
from agent.otlp.exporter import OtlpExporter
from agent.state import AgentState
from agent.store import Store
from tests.agent.alerts.conftest import make_regression, say_closed, say_opened, say_updated, wait_for
from tests.agent.otlp.receiver import OtlpReceiver, prometheus_samples, prometheus_view
from tests.dashboards.conftest import make_window

ALERTS = AlertsConfig(group_wait_seconds=0, backoff_initial_seconds=0.1, backoff_max_seconds=0.5)
# A long outage's backoff: a record retried only at these would miss the test's wait after the outage.
LONG_BACKOFF = AlertsConfig(group_wait_seconds=0, backoff_initial_seconds=300, backoff_max_seconds=300)


@pytest.fixture
def agent(tmp_path):
    """An exporter over a real store and a real alert service (which files each episode), built per test."""
    made = []

    def build(endpoint: str, *, interval: float = 3600.0, timeout: float = 1.0, alerts_config=ALERTS):
        conf = config_from_dict({"store_dir": str(tmp_path / "store"), "alerts": {
            "group_wait_seconds": 0, "host": "h1", "external_url": "http://infersight.test:9464"}})
        store = Store.open(conf.store_dir)
        alerts = AlertService(conf, store)
        state = AgentState()
        state.record_window(make_window(target="server"))
        registry = build_registry(state)
        s = settings(OtlpConfig(endpoint=endpoint, timeout_seconds=timeout, export_interval_seconds=interval,
                                headers={"Authorization": "Bearer t0k"}), interval_seconds=5.0, environ={},
                     host="h1")
        exporter = OtlpExporter(s, registry, store, alerts_config, host="h1", external_url="http://infersight.test:9464",
                                started=time.time(), on_error=state.count_error)
        registry.register(exporter.collector())
        made.append((exporter, alerts, store))
        return exporter, alerts, state, registry

    yield build
    for exporter, alerts, store in made:
        exporter.stop()
        alerts.stop()
        store.close()


def _tell(exporter, alerts, say, reg) -> None:
    say(alerts, reg)
    getattr(exporter.events, say.__name__.replace("say_", "regression_"))(reg)


def test_metrics_arrive_as_protobuf_with_headers_and_equal_metrics(agent) -> None:
    r = OtlpReceiver().start()
    try:
        exporter, _, _, registry = agent(r.endpoint)
        families = list(text_string_to_metric_families(generate_latest(registry).decode()))
        assert exporter.export_metrics().accepted
        (arrival,) = r.accepted()
        assert arrival.path == "/v1/metrics"
        assert arrival.headers["Content-Type"] == "application/x-protobuf"
        assert arrival.headers["Authorization"] == "Bearer t0k"
        got = prometheus_view(r.metric_points(), families)
        want = prometheus_samples(families)
        for key in ("infersight_syscalls_total", "infersight_offcpu_seconds_total",
                    "infersight_gc_pause_seconds_bucket", "infersight_runqueue_latency_seconds_count",
                    "infersight_tcp_retransmits_total", "infersight_request_latency_seconds"):
            assert {k: v for k, v in got.items() if k[0] == key} == {k: v for k, v in want.items() if k[0] == key}
    finally:
        r.stop()


def test_regression_opened_reranked_only_on_a_new_top_cause_and_closed(agent) -> None:
    r = OtlpReceiver().start()
    try:
        exporter, alerts, _, _ = agent(r.endpoint)
        exporter.start()
        reg = make_regression("reg-1", opened_at=time.time() - 30, top="gc")
        _tell(exporter, alerts, say_opened, reg)
        _tell(exporter, alerts, say_updated, make_regression("reg-1", opened_at=reg.opened_at, top="gc"))
        _tell(exporter, alerts, say_updated, make_regression("reg-1", opened_at=reg.opened_at, top="lock"))
        _tell(exporter, alerts, say_closed, make_regression("reg-1", opened_at=reg.opened_at, top="lock",
                                                            closed_at=time.time()))
        wait_for(lambda: len(r.log_records()) == 3, what="three records")
        opened, reranked, closed = r.log_records()
        assert [opened["event"], reranked["event"], closed["event"]] == [
            "infersight.regression.opened", "infersight.regression.reranked", "infersight.regression.closed"]
        assert [opened["severity"], closed["severity"]] == ["WARN", "INFO"]
        a = opened["attrs"]
        assert a["target"] == "workload" and a["cause"] == "gc" and a["severity"] == "warning"
        assert a["infersight.regression.id"] == "reg-1" and a["alertname"] == "InferenceLatencyRegression"
        assert a["infersight.regression.causes"] == ["gc", "cpu_contention"]
        assert a["infersight.regression.cause_scores"] == [0.8, 0.1]
        assert a["infersight.regression.cause_evidence"][0] == "gc evidence: 41 ms/s vs 0.8 ms/s (x51)"
        assert a["infersight.regression.functions"] == ["gc_heavy (workload/model.py:42)"]
        assert a["infersight.regression.url"] == "http://infersight.test:9464/regressions/reg-1"
        assert opened["body"].startswith("Latency regression on workload (pid 4242), warning, open: top cause gc")
        assert opened["resource"]["infersight.target"] == "workload"
        assert reranked["attrs"]["cause"] == "lock"
        assert "infersight.regression.closed_at" in closed["attrs"]
    finally:
        r.stop()


@pytest.mark.parametrize("mode", ["refused", "500", "reset", "drip"])
def test_a_bad_collector_costs_a_counted_failure_within_the_deadline(agent, mode) -> None:
    if mode == "refused":
        r = OtlpReceiver()  # never started: the port refuses
    elif mode == "500":
        r = OtlpReceiver(answer=lambda n: (500, 0.0)).start()
    elif mode == "drip":
        r = OtlpReceiver(answer=lambda n: (200, 5.0)).start()
    else:
        r = _Resetter()
    try:
        exporter, _, state, _ = agent(r.endpoint, timeout=1.0)
        started = time.monotonic()
        result = exporter.export_metrics()
        assert not result.accepted and result.error
        assert time.monotonic() - started < 3.0
        assert state.snapshot().agent_errors["otlp"] == 1
        assert exporter.counts() == {("metrics", "failed"): 1}
    finally:
        r.stop()


class _Resetter:
    """Accepts and closes at once with RST (SO_LINGER 0): a connection reset mid-request."""

    def __init__(self) -> None:
        import socket
        import struct
        import threading

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._linger = struct.pack("ii", 1, 0)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket

        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.recv(64)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, self._linger)
            conn.close()

    def stop(self) -> None:
        self._sock.close()


def test_collector_down_then_back_records_arrive_after_and_metrics_never_queue(agent) -> None:
    """An outage (shortened; the code has no notion of its length, and the backoff is a long outage's): the
    regression opened during it is held in the outbox and delivered, in order, as soon as the Collector answers a
    metrics export again, not when its backoff (300 s here) runs out."""
    r = OtlpReceiver()  # down
    exporter, alerts, state, _ = agent(r.endpoint, interval=1.0, timeout=0.5, alerts_config=LONG_BACKOFF)
    exporter.start()
    reg = make_regression("reg-down", opened_at=time.time() - 30)
    _tell(exporter, alerts, say_opened, reg)
    _tell(exporter, alerts, say_closed, make_regression("reg-down", opened_at=reg.opened_at,
                                                        closed_at=time.time()))
    wait_for(lambda: exporter.counts().get(("metrics", "failed"), 0) >= 2, what="failed metrics exports")
    wait_for(lambda: exporter.counts().get(("logs", "retried"), 0) >= 1, what="a retried record")
    assert exporter.pending_records() == 2
    assert state.snapshot().agent_errors["otlp"] >= 3
    r.start()
    try:
        wait_for(lambda: len(r.log_records()) == 2, timeout=20, what="records after the outage")
        assert [x["event"] for x in r.log_records()] == ["infersight.regression.opened",
                                                          "infersight.regression.closed"]
        wait_for(lambda: r.docs("/v1/metrics"), what="metrics after the outage")
        assert exporter.pending_records() == 0
    finally:
        r.stop()
