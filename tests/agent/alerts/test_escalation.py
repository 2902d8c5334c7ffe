"""Escalation through the real outbox to real loopback receivers, across an agent restart: a warning that
becomes critical reaches a `min_severity = "critical"` receiver, a receiver that had the warning hears it
replaced, and nothing is lost or repeated when the agent stops in between."""

from __future__ import annotations

import time
from pathlib import Path

from agent.alerts.payloads import fingerprint
from agent.alerts.service import AlertService
from agent.config import config_from_dict
from agent.store import Store
from tests.agent.alerts.conftest import say_closed, say_opened, say_updated, wait_for


def alerts_in(arrival) -> list[tuple[str, str]]:
    return [(a["status"], a["labels"]["severity"]) for a in arrival.doc["alerts"]]


def test_escalation_reaches_the_critical_receiver_through_the_outbox_and_a_restart(tmp_path: Path, receivers,
                                                                                   make_reg) -> None:
    ops = receivers()
    pager = receivers(start=False)  # down when the escalation is queued: it waits in the outbox
    conf = config_from_dict({
        "store_dir": str(tmp_path / "store"),
        "alerts": {"group_wait_seconds": 0, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 0.5,
                   "host": "h1", "external_url": "http://infersight.test:9464"},
        "receivers": [{"name": "ops", "url": ops.url},
                      {"name": "pager", "url": pager.url, "min_severity": "critical", "timeout_seconds": 1}]})
    opened = time.time() - 120

    with Store.open(conf.store_dir) as store:
        first = AlertService(conf, store)
        first.start()
        try:
            say_opened(first, make_reg("esc-1", opened_at=opened))
            wait_for(lambda: len(ops.accepted()) == 1, what="the warning")
            say_updated(first, make_reg("esc-1", opened_at=opened, severity="critical"))
            wait_for(lambda: len(ops.accepted()) == 2, what="the escalation at ops")
            wait_for(lambda: any(s.receiver == "pager" and s.last_error for s in first.summaries()),
                     what="the pager's refused attempt")
        finally:
            first.stop()
    assert [alerts_in(a) for a in ops.accepted()] == [[("firing", "warning")],
                                                      [("firing", "critical"), ("resolved", "warning")]]
    assert pager.arrivals == []

    pager.start()
    with Store.open(conf.store_dir) as store:
        second = AlertService(conf, store)
        second.start()
        try:
            wait_for(lambda: len(pager.accepted()) == 1, what="the escalation at the pager after the restart")
            # The resumed detector reports the open regression again, at critical, then milder: no new message.
            say_opened(second, make_reg("esc-1", opened_at=opened, severity="critical"))
            say_updated(second, make_reg("esc-1", opened_at=opened, severity="warning"))
            time.sleep(1.5)
            assert len(ops.accepted()) == 2 and len(pager.accepted()) == 1
            reg = make_reg("esc-1", opened_at=opened, severity="warning")
            reg.closed_at = time.time()
            say_closed(second, reg)
            wait_for(lambda: len(ops.accepted()) == 3 and len(pager.accepted()) == 2, what="the resolves")
        finally:
            second.stop()

    assert [alerts_in(a) for a in pager.accepted()] == [[("firing", "critical")], [("resolved", "critical")]]
    assert alerts_in(ops.accepted()[2]) == [("resolved", "critical")]
    warning, critical = ops.accepted()[0].doc["alerts"][0], pager.accepted()[0].doc["alerts"][0]
    assert critical["labels"] == {**warning["labels"], "severity": "critical"}
    assert critical["fingerprint"] == fingerprint(critical["labels"]) != warning["fingerprint"]
    assert ops.accepted()[1].doc["alerts"][1]["fingerprint"] == warning["fingerprint"]
    # Each notification has its own key; the pager's copy of the escalation is not the one ops got.
    keys = [a.headers["Idempotency-Key"] for a in ops.accepted() + pager.accepted()]
    assert len(set(keys)) == 5
