"""The alerter's state moves on a controlled clock: group wait, repeats, resolve off, closed inside the wait,
and a second `opened` for a known regression (a restarted detector) adding nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.alerts.alerter import Alerter
from agent.alerts.config import AlertsConfig, ReceiverConfig
from agent.store import Store


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
                     ReceiverConfig(name="am", kind="alertmanager", url="http://127.0.0.1:2"))
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
    alerter.regression_opened(make_reg("a", opened_at=clock.now))
    clock.now += 9
    alerter.tick()
    assert queued(store) == []
    clock.now += 1
    alerter.tick()
    assert [q[0] for q in queued(store)] == ["firing"]
    clock.now += 599
    alerter.regression_updated(make_reg("a", opened_at=clock.now, top="lock"))
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
    alerter.regression_opened(reg)
    clock.now += 3
    reg.closed_at = clock.now
    alerter.regression_closed(reg)
    assert [q[0] for q in queued(store)] == ["firing", "resolved"]
    alerter.regression_closed(reg)
    alerter.regression_opened(reg)
    clock.now += 10_000
    alerter.tick()
    assert len(queued(store)) == 2


def test_resolve_off_sends_no_resolve(setup, make_reg) -> None:
    alerter, store, clock = setup(resolve=False, group_wait_seconds=0)
    reg = make_reg("c", opened_at=clock.now)
    alerter.regression_opened(reg)
    reg.closed_at = clock.now + 5
    alerter.regression_closed(reg)
    assert [q[0] for q in queued(store)] == ["firing"]
    (state,), = store.query("SELECT state FROM alerts")
    assert state == "resolved"


def test_opened_again_is_an_update_not_a_second_alert(setup, make_reg) -> None:
    alerter, store, clock = setup(group_wait_seconds=0)
    alerter.regression_opened(make_reg("d", opened_at=clock.now))
    alerter.regression_opened(make_reg("d", opened_at=clock.now, top="network"))
    assert len(queued(store)) == 1
    assert store.query("SELECT COUNT(*) FROM alerts") == [(1,)]
