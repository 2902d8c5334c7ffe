"""A store written by an earlier release (schema version 4, tests/agent/fixtures/store_v4) opens with today's code,
migrates in place and answers exactly as that release did: windows, profiles, aggregates, regressions, detector
state, alerts and their notifications, the minute rollup, and the page's JSON over them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from agent.store import Store
from tests.agent.fixtures.store_v4 import ANSWERS, DB_DIR, answers, copy_to


def test_the_fixture_is_the_old_schema() -> None:
    conn = sqlite3.connect(f"file:{DB_DIR / 'infersight.db'}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone() == (4,)
        assert conn.execute("SELECT COUNT(*) FROM windows").fetchone() == (60,)
    finally:
        conn.close()


def _without_fields_added_since(value: Any) -> Any:
    """An answer less the record fields added after the fixture's release, where they hold their default: a
    Window's `members` ([] for a single process, issue 31) and a cause's `pid` and `process` (None outside a
    family), a regression's `change_id` (None unless it followed a change, issue 35), a Window's `delivery` (issue 32)
    and `pressure` (issue 34) where null, a cause's `neighbours` (empty but for cpu_contention, issue 34) and `growers` (empty but for memory) and `writers` (empty but for a disk stall), a run-queue
    reading's `culprits` and `charged_seconds` where not measured (issue 34). Anything else must still be
    byte-for-byte what that release answered; JSON inside a page's body too."""
    if isinstance(value, list):
        return [_without_fields_added_since(v) for v in value]
    if isinstance(value, str) and value[:1] in "[{":
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return json.dumps(_without_fields_added_since(parsed), sort_keys=True)
    if not isinstance(value, dict):
        return value
    out = {k: _without_fields_added_since(v) for k, v in value.items()}
    if "start" in out and "end" in out and out.get("members") == []:
        del out["members"]
    for key in ("delivery", "pressure"):
        if "start" in out and "end" in out and key in out and out[key] is None:
            del out[key]
    if "histogram" in out and "total_seconds" in out and out.get("culprits") == [] and "charged_seconds" in out \
            and out["charged_seconds"] is None:
        del out["culprits"], out["charged_seconds"]
    if "severity" in out and "opened_at" in out and out.get("change_id", 0) is None:
        del out["change_id"]
    if "label" in out and "evidence" in out:
        for key in ("pid", "process"):
            if out.get(key, 0) is None:
                del out[key]
        for key in ("neighbours", "growers", "writers"):
            if out.get(key) == []:
                del out[key]
    return out


def test_an_old_store_migrates_in_place_and_answers_byte_for_byte(tmp_path: Path) -> None:
    directory = copy_to(tmp_path / "store")
    with Store.open(directory) as store:
        migrated = store.schema_version()
    got = _without_fields_added_since(json.loads(answers(directory)))
    expected = _without_fields_added_since(json.loads(ANSWERS.read_text()))
    assert migrated >= 4
    if got != expected:
        # Name the first answer that differs, not a 260 KB diff.
        differing = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
        raise AssertionError(f"answers changed after migration: {differing}")


def test_old_alerts_lose_their_json_copy_and_repeat_from_the_regressions_table(tmp_path: Path) -> None:
    import json

    from agent.alerts.alerter import Alerter
    from agent.alerts.config import AlertsConfig
    from tests.agent.fixtures.store_v4 import NOW, Clock, receivers

    conn = sqlite3.connect(f"file:{DB_DIR / 'infersight.db'}?mode=ro", uri=True)
    try:
        (copy,), = conn.execute("SELECT regression FROM alerts WHERE regression_id = 'server-1799998800'")
    finally:
        conn.close()
    old = json.loads(copy)
    directory = copy_to(tmp_path / "store")
    clock = Clock(NOW + 600)
    with Store.open(directory, clock=clock) as store:
        assert "regression" not in {r[1] for r in store.query("PRAGMA table_info(alerts)")}
        alerter = Alerter(AlertsConfig(group_wait_seconds=10, repeat_interval_seconds=600), receivers(), store,
                          host="fixture-host", external_url="http://infersight.example", clock=clock)
        alerter.tick()
        (body,), = store.query("SELECT body FROM alert_notifications WHERE receiver = 'hook' AND created_at = ?",
                               (clock.now,))
    (sent,) = json.loads(body)["alerts"]
    # The repeat carries what the old row's copy held (the re-ranked causes), now read from regressions.
    ranked = [line.split(" ")[1] for line in sent["annotations"]["description"].splitlines()[:2]]
    assert ranked == [c["label"] for c in old["causes"]]
    assert f"score {old['score']:.2f}" in sent["annotations"]["summary"]


def test_an_old_alert_whose_regression_was_never_stored_keeps_it_as_a_test_row(tmp_path: Path) -> None:
    """Only `infersight alert test` made alerts without a stored episode; the migration keeps their copy."""
    directory = copy_to(tmp_path / "store")
    conn = sqlite3.connect(directory / "infersight.db")
    try:
        (copy,), = conn.execute("SELECT regression FROM alerts WHERE regression_id = 'batch-1799997000'")
        conn.execute("DELETE FROM regressions WHERE id = 'batch-1799997000'")
        conn.commit()
    finally:
        conn.close()
    with Store.open(directory) as store:
        assert store.regression("batch-1799997000") is None
        assert "batch-1799997000" not in {r.id for r in store.regressions()}
        (data, test, top), = store.query("SELECT data, test, top_cause FROM regressions WHERE id = ?",
                                         ("batch-1799997000",))
    assert (data, test) == (copy, 1) and top == "gc"
