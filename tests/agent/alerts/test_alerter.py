"""The alerter's state moves on a controlled clock: group wait, repeats, resolve off, closed inside the wait,
a second `opened` for a known regression (a restarted detector) adding nothing, escalation and de-escalation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.alerts import payloads
from agent.alerts.alerter import Alerter
from agent.alerts.config import AlertsConfig, ReceiverConfig
from agent.store import Store
from tests.agent.alerts.conftest import say_closed, say_opened, say_updated


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path: Path):
    stores = []

    def build(**alerts) -> tuple[Alerter, Store, Clock]:
        store = Store.open(tmp_path / f"store{len(stores)}")
        stores.append(store)
        clock = Clock()
        receivers = (ReceiverConfig(name="hook", url="http://127.0.0.1:1/"),
                     ReceiverConfig(name="am", kind="alertmanager", url="http://127.0.0.1:2"),
                     ReceiverConfig(name="pager", url="http://127.0.0.1:3/", min_severity="critical"))
        config = AlertsConfig(**{"group_wait_seconds": 10, "repeat_interval_seconds": 600, **alerts})
        return Alerter(config, receivers, store, host="h", external_url="http://x", clock=clock), store, clock

    yield build
    for s in stores:
        s.close()


def queued(store: Store, receiver: str = "hook") -> list[tuple[str, str, dict]]:
    return [(status, key, json.loads(body)) for status, key, body in store.query(
        "SELECT status, idempotency_key, body FROM alert_notifications WHERE receiver = ? ORDER BY id", (receiver,))]


def test_group_wait_then_repeat_with_the_same_fingerprint(setup, make_reg) -> None:
    alerter, store, clock = setup()
    say_opened(alerter, make_reg("a", opened_at=clock.now))
    clock.now += 9
    alerter.tick()
    assert queued(store) == []
    clock.now += 1
    alerter.tick()
    assert [q[0] for q in queued(store)] == ["firing"]
    clock.now += 599
    say_updated(alerter, make_reg("a", opened_at=clock.now, top="lock"))
    assert len(queued(store)) == 1
    clock.now += 1
    alerter.tick()
    first, repeat = queued(store)
    assert repeat[0] == "firing" and repeat[1] != first[1]
    assert repeat[2]["alerts"][0]["fingerprint"] == first[2]["alerts"][0]["fingerprint"]
    # Labels stay as first sent; the repeat's description carries the re-ranked causes.
    assert repeat[2]["alerts"][0]["labels"]["cause"] == "gc"
    assert repeat[2]["alerts"][0]["annotations"]["description"].startswith("1. lock")
    # Alertmanager's copy stays active past the next repeat: endsAt = now + repeat + grace.
    am = queued(store, "am")
    assert [q[2][0]["endsAt"] for q in am] == ["2027-01-15T08:15:10Z", "2027-01-15T08:25:10Z"]


def test_closed_inside_group_wait_sends_firing_then_resolved(setup, make_reg) -> None:
    alerter, store, clock = setup()
    reg = make_reg("b", opened_at=clock.now)
    say_opened(alerter, reg)
    clock.now += 3
    reg.closed_at = clock.now
    say_closed(alerter, reg)
    assert [q[0] for q in queued(store)] == ["firing", "resolved"]
    say_closed(alerter, reg)
    say_opened(alerter, reg)
    clock.now += 10_000
    alerter.tick()
    assert len(queued(store)) == 2


def test_resolve_off_sends_no_resolve(setup, make_reg) -> None:
    alerter, store, clock = setup(resolve=False, group_wait_seconds=0)
    reg = make_reg("c", opened_at=clock.now)
    say_opened(alerter, reg)
    reg.closed_at = clock.now + 5
    say_closed(alerter, reg)
    assert [q[0] for q in queued(store)] == ["firing"]
    (state,), = store.query("SELECT state FROM alerts")
    assert state == "resolved"


def test_opened_again_is_an_update_not_a_second_alert(setup, make_reg) -> None:
    alerter, store, clock = setup(group_wait_seconds=0)
    say_opened(alerter, make_reg("d", opened_at=clock.now))
    say_opened(alerter, make_reg("d", opened_at=clock.now, top="network"))
    assert len(queued(store)) == 1
    assert store.query("SELECT COUNT(*) FROM alerts") == [(1,)]


def alerts_in(doc: dict) -> list[tuple[str, str, str]]:
    """(status, severity, fingerprint) of each alert in a webhook v4 body."""
    return [(a["status"], a["labels"]["severity"], a["fingerprint"]) for a in doc["alerts"]]


def test_escalation_fires_the_critical_alert_and_resolves_the_warning_one(setup, make_reg) -> None:
    alerter, store, clock = setup()
    say_opened(alerter, make_reg("e", opened_at=clock.now))
    clock.now += 10
    alerter.tick()
    (first,) = queued(store)
    warning_fp = first[2]["alerts"][0]["fingerprint"]
    assert queued(store, "pager") == []
    clock.now += 30
    say_updated(alerter, make_reg("e", opened_at=clock.now - 40, severity="critical", top="lock"))
    escalation = queued(store)[1]
    assert escalation[0] == "firing" and escalation[2]["status"] == "firing"
    critical_labels = {**first[2]["alerts"][0]["labels"], "severity": "critical"}
    critical_fp = payloads.fingerprint(critical_labels)
    # One message: the alert at its new severity (a new label set, so a new fingerprint) and, for a receiver
    # that had the warning, that alert's end. Only the severity label changed (cause stays as first sent).
    assert alerts_in(escalation[2]) == [("firing", "critical", critical_fp), ("resolved", "warning", warning_fp)]
    assert escalation[2]["alerts"][0]["labels"] == critical_labels
    assert escalation[2]["alerts"][1]["endsAt"] == payloads.rfc3339(clock.now)
    assert escalation[2]["commonLabels"] == {k: v for k, v in critical_labels.items() if k != "severity"}
    # The critical-only receiver hears of it now, for the first time, without the warning it never got.
    (page,) = queued(store, "pager")
    assert alerts_in(page[2]) == [("firing", "critical", critical_fp)]
    am = queued(store, "am")[1][2]
    assert [(a["labels"]["severity"], a["endsAt"]) for a in am] == [
        ("critical", payloads.rfc3339(clock.now + 600 + 300)), ("warning", payloads.rfc3339(clock.now))]
    (severity, fp), = store.query("SELECT severity, fingerprint FROM alerts")
    assert (severity, fp) == ("critical", critical_fp)

    # Critical again, then milder: nothing new. The alert keeps the highest severity until it closes.
    say_updated(alerter, make_reg("e", opened_at=clock.now - 40, severity="critical"))
    say_updated(alerter, make_reg("e", opened_at=clock.now - 40, severity="warning"))
    assert len(queued(store)) == 2 and len(queued(store, "pager")) == 1
    # The repeat comes a repeat interval after the escalation, still critical, summary included.
    clock.now += 599
    alerter.tick()
    assert len(queued(store, "pager")) == 1
    clock.now += 1
    alerter.tick()
    repeat = queued(store, "pager")[1][2]
    assert alerts_in(repeat) == [("firing", "critical", critical_fp)]
    assert ", critical, open" in repeat["alerts"][0]["annotations"]["summary"]
    reg = make_reg("e", opened_at=clock.now - 640, severity="warning", closed_at=clock.now + 5)
    say_closed(alerter, reg)
    for name in ("hook", "pager"):
        assert alerts_in(queued(store, name)[-1][2]) == [("resolved", "critical", critical_fp)]
    assert [q[0] for q in queued(store)] == ["firing", "firing", "firing", "resolved"]


def test_severity_moves_inside_group_wait_fire_once_at_the_highest(setup, make_reg) -> None:
    alerter, store, clock = setup()
    say_opened(alerter, make_reg("w", opened_at=clock.now))
    clock.now += 3
    say_updated(alerter, make_reg("w", opened_at=clock.now, severity="critical"))
    say_updated(alerter, make_reg("w", opened_at=clock.now, severity="warning"))
    assert queued(store) == [] and queued(store, "pager") == []
    clock.now += 7
    alerter.tick()
    for name in ("hook", "pager"):
        (only,) = queued(store, name)
        assert [(s, sev) for s, sev, _ in alerts_in(only[2])] == [("firing", "critical")]


def test_escalated_on_its_last_window_still_pages(setup, make_reg) -> None:
    """Closed at critical after a warning went out: the pager hears it was critical, then that it ended."""
    alerter, store, clock = setup(group_wait_seconds=0)
    say_opened(alerter, make_reg("l", opened_at=clock.now))
    clock.now += 60
    say_closed(alerter, make_reg("l", opened_at=clock.now - 60, severity="critical", closed_at=clock.now))
    assert [[(s, sev) for s, sev, _ in alerts_in(q[2])] for q in queued(store, "pager")] == [
        [("firing", "critical")], [("resolved", "critical")]]
    assert [[(s, sev) for s, sev, _ in alerts_in(q[2])] for q in queued(store)] == [
        [("firing", "warning")], [("firing", "critical"), ("resolved", "warning")], [("resolved", "critical")]]


def test_escalation_with_resolve_off_sends_no_resolved_alert(setup, make_reg) -> None:
    alerter, store, clock = setup(group_wait_seconds=0, resolve=False)
    say_opened(alerter, make_reg("n", opened_at=clock.now))
    say_updated(alerter, make_reg("n", opened_at=clock.now, severity="critical"))
    assert [[(s, sev) for s, sev, _ in alerts_in(q[2])] for q in queued(store)] == [
        [("firing", "warning")], [("firing", "critical")]]
    assert len(queued(store, "am")[1][2]) == 1


def test_an_escalated_alert_stays_escalated_across_a_restart(setup, make_reg) -> None:
    """A new Alerter over the same store (the agent restarted) and a detector that resumes the open regression
    at critical: no second escalation; at warning: no de-escalation."""
    alerter, store, clock = setup(group_wait_seconds=0)
    say_opened(alerter, make_reg("r", opened_at=clock.now))
    say_updated(alerter, make_reg("r", opened_at=clock.now, severity="critical"))
    again = Alerter(alerter.config, alerter.receivers, store, host="h", external_url="http://x", clock=clock)
    say_opened(again, make_reg("r", opened_at=clock.now, severity="critical"))
    say_updated(again, make_reg("r", opened_at=clock.now, severity="warning"))
    assert len(queued(store)) == 2 and len(queued(store, "pager")) == 1
