"""AlertService in process against real loopback receivers: order, retries, expiry, refusals, filters, no stall."""

from __future__ import annotations

import time

from agent.alerts.signing import verify
from tests.agent.alerts.conftest import say_closed, say_opened, say_updated, wait_for


def statuses(receiver) -> list[tuple[str, str]]:
    return [(a.doc["alerts"][0]["labels"]["regression"], a.doc["status"]) for a in receiver.accepted()]


def test_firing_then_resolved_with_labels_annotations_and_key(receivers, service_for, make_reg) -> None:
    r = receivers()
    svc = service_for([{"name": "ops", "url": r.url, "headers": {"X-Team": "ml"}}])
    reg = make_reg("reg-1", opened_at=time.time() - 30)
    say_opened(svc, reg)
    wait_for(lambda: len(r.accepted()) == 1, what="firing")
    reg.closed_at = time.time()
    say_closed(svc, reg)
    wait_for(lambda: len(r.accepted()) == 2, what="resolved")
    firing, resolved = (a.doc for a in r.accepted())
    assert [firing["status"], resolved["status"]] == ["firing", "resolved"]
    alert = firing["alerts"][0]
    assert alert["labels"] == {"alertname": "InferenceLatencyRegression", "target": "workload", "host": "h1",
                               "cause": "gc", "severity": "warning", "regression": "reg-1"}
    assert alert["annotations"]["description"].startswith("1. gc (0.80): gc evidence")
    assert alert["annotations"]["regression_url"] == "http://infersight.test:9464/regressions/reg-1"
    assert "/api/flamegraph/diff?target=workload" in alert["annotations"]["flamegraph_url"]
    assert alert["endsAt"] == "0001-01-01T00:00:00Z" and resolved["alerts"][0]["endsAt"] != alert["endsAt"]
    assert alert["fingerprint"] == resolved["alerts"][0]["fingerprint"]
    keys = [a.headers["Idempotency-Key"] for a in r.accepted()]
    assert len(set(keys)) == 2 and all(len(k) == 32 for k in keys)
    assert all(a.headers["X-Team"] == "ml" for a in r.accepted())
    assert "X-Infersight-Signature" not in r.accepted()[0].headers
    assert svc.counters.snapshot() == {("ops", "sent"): 2}


def test_group_wait_takes_the_latest_ranking_and_updates_do_not_renotify(receivers, service_for, make_reg) -> None:
    r = receivers()
    svc = service_for([{"name": "ops", "url": r.url}], group_wait_seconds=1.0)
    say_opened(svc, make_reg("reg-2", top="gc"))
    time.sleep(0.3)
    assert r.arrivals == []
    say_updated(svc, make_reg("reg-2", top="lock"))
    wait_for(lambda: len(r.accepted()) == 1, what="firing after group wait")
    for _ in range(3):
        say_updated(svc, make_reg("reg-2", top="network"))
    time.sleep(1.5)
    assert len(r.arrivals) == 1
    assert r.accepted()[0].doc["alerts"][0]["labels"]["cause"] == "lock"


def test_resolve_waits_for_its_firing_through_500s(receivers, service_for, make_reg) -> None:
    r = receivers(answer=lambda n: (500, 0.0) if n < 3 else (200, 0.0))
    svc = service_for([{"name": "ops", "url": r.url}])
    reg = make_reg("reg-3")
    say_opened(svc, reg)
    reg.closed_at = time.time()
    say_closed(svc, reg)
    wait_for(lambda: len(r.accepted()) == 2, what="both delivered")
    assert statuses(r) == [("reg-3", "firing"), ("reg-3", "resolved")]
    firing_keys = {a.headers["Idempotency-Key"] for a in r.arrivals if a.doc["status"] == "firing"}
    assert len(firing_keys) == 1 and len(r.arrivals) == 5
    # The receiver counts a delivery when it answers; the sender records it sent once the answer is back.
    wait_for(lambda: svc.summaries()[0].counts["sent"] == 2, what="both recorded as sent")
    (s,) = svc.summaries()
    assert s.counts["sent"] == 2 and s.counts["pending"] == 0 and "HTTP 500" in s.last_error


def test_client_error_fails_for_good_and_redirect_is_not_followed(receivers, service_for, make_reg) -> None:
    bad = receivers(answer=lambda n: (400, 0.0))
    moved = receivers(answer=lambda n: (302, 0.0))
    svc = service_for([{"name": "bad", "url": bad.url}, {"name": "moved", "url": moved.url}])
    say_opened(svc, make_reg("reg-4"))
    wait_for(lambda: all(s.counts["failed"] == 1 for s in svc.summaries()), what="both failed")
    by = {s.receiver: s for s in svc.summaries()}
    assert "HTTP 400" in by["bad"].last_error and "redirect" in by["moved"].last_error
    assert len(bad.arrivals) == 1 and len(moved.arrivals) == 1


def test_expired_after_retry_max_age(service_for, make_reg) -> None:
    svc = service_for([{"name": "gone", "url": "http://127.0.0.1:9/hook", "timeout_seconds": 0.5}],
                      retry_max_age_seconds=1)
    say_opened(svc, make_reg("reg-5"))
    wait_for(lambda: svc.summaries()[0].counts["expired"] == 1, what="expiry")
    (s,) = svc.summaries()
    assert s.counts["pending"] == 0 and "gave up" in s.last_error and "connection refused" in s.last_error
    assert svc.counters.snapshot()[("gone", "expired")] == 1


def test_filters_by_severity_and_target(receivers, service_for, make_reg) -> None:
    crit = receivers()
    only_db = receivers()
    svc = service_for([{"name": "crit", "url": crit.url, "min_severity": "critical"},
                       {"name": "db", "url": only_db.url, "targets": ["db"]}])
    say_opened(svc, make_reg("w", severity="warning"))
    say_opened(svc, make_reg("c", severity="critical"))
    say_opened(svc, make_reg("d", target="db#77"))
    wait_for(lambda: len(crit.accepted()) == 1 and len(only_db.accepted()) == 1, what="filtered deliveries")
    time.sleep(0.5)
    assert statuses(crit) == [("c", "firing")] and statuses(only_db) == [("d", "firing")]


def test_hung_receiver_stalls_neither_the_detector_nor_other_receivers(receivers, service_for, make_reg) -> None:
    hung = receivers(answer=lambda n: (200, 30.0))
    fine = receivers()
    svc = service_for([{"name": "hung", "url": hung.url, "timeout_seconds": 1},
                       {"name": "fine", "url": fine.url}])
    started = time.monotonic()
    for i in range(5):
        say_opened(svc, make_reg(f"h{i}"))
    assert time.monotonic() - started < 1.0
    wait_for(lambda: len(fine.accepted()) == 5, timeout=5, what="the healthy receiver")
    wait_for(lambda: any(s.last_error for s in svc.summaries()), timeout=5, what="the hung receiver's timeout")
    by = {s.receiver: s for s in svc.summaries()}
    assert by["hung"].counts["sent"] == 0 and "timed out after 1 s" in by["hung"].last_error


def test_signed_when_a_secret_is_set(receivers, service_for, make_reg, monkeypatch) -> None:
    monkeypatch.setenv("OPS_SECRET", "s3cr3t-value")
    r = receivers()
    svc = service_for([{"name": "ops", "url": r.url, "hmac_secret_env": "OPS_SECRET"}])
    say_opened(svc, make_reg("reg-6"))
    wait_for(lambda: len(r.accepted()) == 1, what="signed firing")
    a = r.accepted()[0]
    assert verify(b"s3cr3t-value", a.headers, a.body)
    assert not verify(b"other", a.headers, a.body)
