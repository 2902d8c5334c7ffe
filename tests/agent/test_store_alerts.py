"""The alerts table holds a regression's id, never a copy of it: the schema, a re-rank that writes no alert row,
an episode not in the store refused, the synthetic episode of `infersight alert test` kept out of listings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agent.alerts.alerter import Alerter
from agent.alerts.config import AlertsConfig, ReceiverConfig
from agent.store import Store, StoreError
from tests.agent.alerts.conftest import make_regression, say_opened, say_updated


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def alerter_on(store: Store, clock: Clock) -> Alerter:
    return Alerter(AlertsConfig(group_wait_seconds=10, repeat_interval_seconds=600),
                   (ReceiverConfig(name="hook", url="http://127.0.0.1:1/"),), store, host="h",
                   external_url="http://x", clock=clock)


def test_alerts_hold_no_regression_json(tmp_path: Path) -> None:
    clock = Clock()
    with Store.open(tmp_path / "store") as store:
        columns = {r[1] for r in store.query("PRAGMA table_info(alerts)")}
        assert "regression" not in columns and "regression_id" in columns
        alerter = alerter_on(store, clock)
        reg = make_regression("a-1", opened_at=clock.now)
        say_opened(alerter, reg)
        clock.now += 10
        alerter.tick()
        before = store.query("SELECT * FROM alerts")
        reranked = dataclasses.replace(reg, causes=list(reversed(reg.causes)), score=9.5)
        say_updated(alerter, reranked)
        # A re-rank is one write to the regressions table; the alert row is left as it was.
        assert store.query("SELECT * FROM alerts") == before
        for row in before:
            for value in row:
                if isinstance(value, str) and value.startswith("{"):
                    assert "causes" not in json.loads(value), f"an alert column holds a regression: {value[:80]}"
        # The repeat is built from the regressions table: the re-ranked causes, in their new order.
        clock.now += 600
        alerter.tick()
        (body,), = store.query("SELECT body FROM alert_notifications ORDER BY id DESC LIMIT 1")
        description = json.loads(body)["alerts"][0]["annotations"]["description"]
        assert description.startswith("1. cpu_contention")


def test_an_episode_not_in_the_store_is_refused_in_one_line(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        alerter = alerter_on(store, Clock())
        with pytest.raises(StoreError, match=r"regression 'ghost' is not in the store: save it before alerting"):
            alerter.regression_opened(make_regression("ghost"))
        assert store.query("SELECT COUNT(*) FROM alerts") == [(0,)]


def test_a_test_episode_alerts_but_no_listing_shows_it(tmp_path: Path) -> None:
    clock = Clock()
    with Store.open(tmp_path / "store") as store:
        alerter = alerter_on(store, clock)
        real = make_regression("real", opened_at=clock.now)
        say_opened(alerter, real)
        test = make_regression("test-1", target="infersight-test", opened_at=clock.now)
        store.save_regression(test, test=True)
        alerter.regression_opened(test)
        clock.now += 10
        alerter.tick()
        assert [r.id for r in store.regressions()] == ["real"]
        assert store.regression("test-1") is None and store.regression("real") == real
        targets = {json.loads(b)["alerts"][0]["labels"]["target"]
                   for (b,) in store.query("SELECT body FROM alert_notifications")}
        assert targets == {"workload", "infersight-test"}
