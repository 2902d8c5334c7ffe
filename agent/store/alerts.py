"""The alert outbox: one alert per regression episode, and the notifications queued for its receivers.

Notifications are committed here before any attempt and handed out per receiver in order (`Outbox`); the
alerter's moves of an alert (`open_alert`, `fire`, `escalate`, ...) run inside its `Store.transaction()`.
An alert holds its episode's id only: each notification is built from the regressions table
(agent.store.findings), where the detector saves every re-rank before it tells the alerter. A queued
notification keeps its rendered body, so what was committed is what is delivered, after a kill -9 too.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import uuid
from dataclasses import dataclass

from agent.store.db import Database, Migration, StoreError
from agent.store.findings import regression_in
from analysis.regression import Regression

MIGRATIONS: tuple[Migration, ...] = (
    Migration(3, "alert outbox: alerts and their notifications", """
        CREATE TABLE alerts (
            id INTEGER PRIMARY KEY,
            regression_id TEXT NOT NULL UNIQUE,
            target TEXT NOT NULL,
            severity TEXT NOT NULL,
            -- waiting: inside group_wait, nothing queued yet; firing; resolved.
            state TEXT NOT NULL CHECK (state IN ('waiting', 'firing', 'resolved')),
            opened_at REAL NOT NULL,
            closed_at REAL,
            notify_at REAL NOT NULL,
            last_fired_at REAL,
            -- Frozen when the first notification is queued: the alert's identity from then on.
            fingerprint TEXT,
            labels TEXT,
            -- The latest Regression as JSON; its causes are re-ranked while the episode is open.
            regression TEXT NOT NULL
        );
        CREATE INDEX alerts_by_state ON alerts(state, notify_at);
        CREATE TABLE alert_notifications (
            id INTEGER PRIMARY KEY,
            alert_id INTEGER NOT NULL REFERENCES alerts(id),
            receiver TEXT NOT NULL,
            -- Who delivers it: the agent, or one `infersight alert test` run.
            owner TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('firing', 'resolved')),
            state TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'failed', 'expired')),
            idempotency_key TEXT NOT NULL UNIQUE,
            body BLOB NOT NULL,
            created_at REAL NOT NULL,
            next_attempt_at REAL NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_attempt_at REAL,
            http_status INTEGER,
            last_error TEXT,
            done_at REAL
        );
        CREATE INDEX alert_notifications_due ON alert_notifications(receiver, owner, state, next_attempt_at);
        CREATE INDEX alert_notifications_by_alert ON alert_notifications(alert_id, receiver, id);
    """),
    # The detector saved every episode before telling the alerter, so a copy without its row came from
    # `infersight alert test`: it is kept, as a test row, so no alert loses its regression.
    Migration(6, "alerts: reference regressions.id instead of a JSON copy of the regression", """
        INSERT INTO regressions(id, target, opened_at, closed_at, severity, top_cause, data, test)
            SELECT regression_id, target, json_extract(regression, '$.opened_at'),
                   json_extract(regression, '$.closed_at'), json_extract(regression, '$.severity'),
                   COALESCE(json_extract(regression, '$.causes[0].label'), 'unknown'), regression, 1
            FROM alerts WHERE regression_id NOT IN (SELECT id FROM regressions);
        ALTER TABLE alerts DROP COLUMN regression;
    """),
)


AGENT_OWNER = "agent"
STATES = ("pending", "sent", "failed", "expired")


@dataclass(frozen=True)
class Notification:
    id: int
    alert_id: int
    receiver: str
    status: str
    idempotency_key: str
    body: bytes
    created_at: float
    attempts: int
    fingerprint: str


@dataclass(frozen=True)
class ReceiverSummary:
    """A receiver's outbox at a glance, for the page, /metrics and `infersight alerts`."""

    receiver: str
    counts: dict[str, int]
    oldest_pending_at: float | None
    last_error: str | None
    last_error_at: float | None
    last_sent_at: float | None


@dataclass(frozen=True)
class NotificationRow:
    receiver: str
    status: str
    state: str
    attempts: int
    created_at: float
    done_at: float | None
    http_status: int | None
    last_error: str | None
    idempotency_key: str


@dataclass(frozen=True)
class AlertRow:
    regression_id: str
    target: str
    severity: str
    state: str
    opened_at: float
    closed_at: float | None
    fingerprint: str | None
    notifications: list[NotificationRow]


def enqueue(conn: sqlite3.Connection, *, alert_id: int, receiver: str, status: str, body: bytes, now: float,
            not_before: float | None = None, owner: str = AGENT_OWNER) -> str:
    """Queue one notification inside the caller's transaction; returns its idempotency key."""
    key = uuid.uuid4().hex
    conn.execute(
        "INSERT INTO alert_notifications(alert_id, receiver, owner, status, state, idempotency_key, body, "
        "created_at, next_attempt_at) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
        (alert_id, receiver, owner, status, key, body, now, now if not_before is None else not_before))
    return key


class Outbox:
    """Reads and updates of alert_notifications; every write is one store transaction."""

    def __init__(self, store: Database) -> None:
        self.store = store

    def expire(self, receiver: str, owner: str, now: float, max_age_s: float) -> int:
        with self.store.transaction() as conn:
            return conn.execute(
                "UPDATE alert_notifications SET state = 'expired', done_at = ?, "
                "last_error = COALESCE(last_error, 'never attempted') || ' (gave up: older than retry_max_age)' "
                "WHERE receiver = ? AND owner = ? AND state = 'pending' AND created_at < ?",
                (now, receiver, owner, now - max_age_s)).rowcount

    def next_due(self, receiver: str, owner: str, now: float) -> Notification | None:
        """The next notification to attempt: due, and no older notification of the same alert still pending
        for this receiver (so a resolve never overtakes its firing)."""
        rows = self.store.query(
            "SELECT n.id, n.alert_id, n.receiver, n.status, n.idempotency_key, n.body, n.created_at, n.attempts, "
            "COALESCE(a.fingerprint, '') FROM alert_notifications n JOIN alerts a ON a.id = n.alert_id "
            "WHERE n.receiver = ? AND n.owner = ? AND n.state = 'pending' AND n.next_attempt_at <= ? "
            "AND NOT EXISTS (SELECT 1 FROM alert_notifications p WHERE p.alert_id = n.alert_id "
            "  AND p.receiver = n.receiver AND p.state = 'pending' AND p.id < n.id) "
            "ORDER BY n.next_attempt_at, n.id LIMIT 1", (receiver, owner, now))
        return Notification(*rows[0]) if rows else None

    def next_wakeup(self, receiver: str, owner: str) -> float | None:
        rows = self.store.query("SELECT MIN(next_attempt_at) FROM alert_notifications "
                                "WHERE receiver = ? AND owner = ? AND state = 'pending'", (receiver, owner))
        return rows[0][0]

    def record(self, notification_id: int, *, state: str, now: float, http_status: int | None,
               error: str | None, next_attempt_at: float | None = None) -> None:
        """The outcome of one attempt: sent/failed (done), or still pending until next_attempt_at. A success
        keeps the last error seen, so the page can say what a delivered notification went through."""
        done = None if state == "pending" else now
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE alert_notifications SET state = ?, attempts = attempts + 1, last_attempt_at = ?, "
                "http_status = ?, last_error = COALESCE(?, last_error), done_at = ?, next_attempt_at = COALESCE(?, next_attempt_at) "
                "WHERE id = ?", (state, now, http_status, error, done, next_attempt_at, notification_id))

    def give_up(self, owner: str, reason: str, now: float) -> None:
        """Mark what one owner left pending as failed (an `alert test` run that is over)."""
        with self.store.transaction() as conn:
            conn.execute("UPDATE alert_notifications SET state = 'failed', done_at = ?, "
                         "last_error = COALESCE(last_error || '; ', '') || ? WHERE owner = ? AND state = 'pending'",
                         (now, reason, owner))

    def state_of(self, key: str) -> NotificationRow | None:
        rows = self.store.query(
            "SELECT receiver, status, state, attempts, created_at, done_at, http_status, last_error, "
            "idempotency_key FROM alert_notifications WHERE idempotency_key = ?", (key,))
        return NotificationRow(*rows[0]) if rows else None

    def summaries(self, receivers: list[str] | None = None) -> list[ReceiverSummary]:
        """One summary per receiver known to config or to the outbox."""
        counts: dict[str, dict[str, int]] = {r: dict.fromkeys(STATES, 0) for r in receivers or []}
        for receiver, state, n in self.store.query(
                "SELECT receiver, state, COUNT(*) FROM alert_notifications WHERE owner = ? GROUP BY receiver, state",
                (AGENT_OWNER,)):
            counts.setdefault(receiver, dict.fromkeys(STATES, 0))[state] = n
        out = []
        for receiver in sorted(counts):
            (oldest,), = self.store.query(
                "SELECT MIN(created_at) FROM alert_notifications WHERE receiver = ? AND owner = ? AND state = 'pending'",
                (receiver, AGENT_OWNER))
            err = self.store.query(
                "SELECT last_error, last_attempt_at FROM alert_notifications WHERE receiver = ? AND owner = ? "
                "AND last_error IS NOT NULL ORDER BY last_attempt_at DESC LIMIT 1", (receiver, AGENT_OWNER))
            (sent_at,), = self.store.query(
                "SELECT MAX(done_at) FROM alert_notifications WHERE receiver = ? AND owner = ? AND state = 'sent'",
                (receiver, AGENT_OWNER))
            out.append(ReceiverSummary(receiver=receiver, counts=counts[receiver], oldest_pending_at=oldest,
                                       last_error=err[0][0] if err else None,
                                       last_error_at=err[0][1] if err else None, last_sent_at=sent_at))
        return out

    def alerts(self, limit: int = 50) -> list[AlertRow]:
        """The newest alerts with every notification queued for them, oldest notification first."""
        rows = self.store.query(
            "SELECT id, regression_id, target, severity, state, opened_at, closed_at, fingerprint FROM alerts "
            "ORDER BY opened_at DESC, id DESC LIMIT ?", (limit,))
        out = []
        for aid, rid, target, severity, state, opened, closed, fp in rows:
            notes = [NotificationRow(*r) for r in self.store.query(
                "SELECT receiver, status, state, attempts, created_at, done_at, http_status, last_error, "
                "idempotency_key FROM alert_notifications WHERE alert_id = ? ORDER BY id", (aid,))]
            out.append(AlertRow(regression_id=rid, target=target, severity=severity, state=state, opened_at=opened,
                                closed_at=closed, fingerprint=fp, notifications=notes))
        return out

    def prune(self, before: float) -> int:
        """Forget finished notifications (and alerts left without any) that ended before `before`."""
        with self.store.transaction() as conn:
            n = conn.execute("DELETE FROM alert_notifications WHERE state != 'pending' AND done_at < ?",
                             (before,)).rowcount
            conn.execute("DELETE FROM alerts WHERE state = 'resolved' AND closed_at < ? AND NOT EXISTS "
                         "(SELECT 1 FROM alert_notifications n WHERE n.alert_id = alerts.id)", (before,))
        return n


# ---- the alerter's moves, inside its transaction -----------------------------------------------------------


@dataclass(frozen=True)
class OpenAlert:
    """An alert not resolved yet, as the alerter's severity check reads it."""

    id: int
    state: str
    severity: str
    labels: dict[str, str] | None
    fingerprint: str | None


@dataclass(frozen=True)
class AlertToSend:
    """What one notification of an alert is built from."""

    regression: Regression
    labels: dict[str, str]
    fingerprint: str
    severity: str
    target: str


def any_due(store: Database, now: float, repeat_before: float) -> bool:
    """A cheap read: is an alert past its group wait, or a firing one due to repeat?"""
    return bool(store.query("SELECT 1 FROM alerts WHERE (state = 'waiting' AND notify_at <= ?) OR "
                            "(state = 'firing' AND last_fired_at <= ?) LIMIT 1", (now, repeat_before)))


def open_alert(conn: sqlite3.Connection, reg: Regression, notify_at: float) -> None:
    """A waiting alert for a new episode; nothing for a known one (a restarted detector). The episode must be
    in the regressions table already: StoreError otherwise, at the call that would alert on nothing."""
    if regression_in(conn, reg.id) is None:
        raise StoreError(f"regression {reg.id!r} is not in the store: save it before alerting on it "
                         "(agent.detection saves every episode before it tells its listeners)")
    conn.execute(
        "INSERT INTO alerts(regression_id, target, severity, state, opened_at, notify_at) "
        "VALUES (?, ?, ?, 'waiting', ?, ?) ON CONFLICT(regression_id) DO NOTHING",
        (reg.id, reg.target, reg.severity, reg.opened_at, notify_at))


def _regression(conn: sqlite3.Connection, regression_id: str, closed_at: float | None) -> Regression:
    """The alert's episode as the detector last saved it; closed when the alert was, whatever the row says."""
    reg = regression_in(conn, regression_id)
    if reg is None:
        raise StoreError(f"alert of regression {regression_id!r}: the regression is not in the store")
    if reg.closed_at is None and closed_at is not None:
        reg = dataclasses.replace(reg, closed_at=closed_at)
    return reg


def alert_state(conn: sqlite3.Connection, regression_id: str) -> tuple[int, str] | None:
    """(alert id, state) of the episode's alert, or None."""
    row = conn.execute("SELECT id, state FROM alerts WHERE regression_id = ?", (regression_id,)).fetchone()
    return (row[0], row[1]) if row else None


def close_alert(conn: sqlite3.Connection, alert_id: int, closed_at: float) -> None:
    conn.execute("UPDATE alerts SET closed_at = ? WHERE id = ?", (closed_at, alert_id))


def mark_resolved(conn: sqlite3.Connection, alert_id: int) -> None:
    conn.execute("UPDATE alerts SET state = 'resolved' WHERE id = ?", (alert_id,))


def waiting_due(conn: sqlite3.Connection, now: float) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM alerts WHERE state = 'waiting' AND notify_at <= ?",
                                       (now,)).fetchall()]


def repeats_due(conn: sqlite3.Connection, before: float) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM alerts WHERE state = 'firing' AND last_fired_at <= ?",
                                       (before,)).fetchall()]


def mark_repeated(conn: sqlite3.Connection, alert_id: int, now: float) -> None:
    conn.execute("UPDATE alerts SET last_fired_at = ? WHERE id = ?", (now, alert_id))


def open_alert_of(conn: sqlite3.Connection, regression_id: str) -> OpenAlert | None:
    row = conn.execute("SELECT id, state, severity, labels, fingerprint FROM alerts WHERE regression_id = ? "
                       "AND state != 'resolved'", (regression_id,)).fetchone()
    if row is None:
        return None
    return OpenAlert(row[0], row[1], row[2], None if row[3] is None else json.loads(row[3]), row[4])


def set_severity(conn: sqlite3.Connection, alert_id: int, severity: str) -> None:
    conn.execute("UPDATE alerts SET severity = ? WHERE id = ?", (severity, alert_id))


def escalate(conn: sqlite3.Connection, alert_id: int, severity: str, labels: dict[str, str], fingerprint: str,
             now: float) -> None:
    conn.execute("UPDATE alerts SET severity = ?, labels = ?, fingerprint = ?, last_fired_at = ? WHERE id = ?",
                 (severity, json.dumps(labels), fingerprint, now, alert_id))


def regression_of(conn: sqlite3.Connection, alert_id: int) -> tuple[Regression, str]:
    """The alert's latest regression and its (highest so far) severity."""
    rid, closed_at, severity = conn.execute("SELECT regression_id, closed_at, severity FROM alerts WHERE id = ?",
                                            (alert_id,)).fetchone()
    return _regression(conn, rid, closed_at), severity


def fire(conn: sqlite3.Connection, alert_id: int, labels: dict[str, str], fingerprint: str, severity: str,
         now: float) -> None:
    """The first firing: the labels and fingerprint are frozen from now on."""
    conn.execute("UPDATE alerts SET state = 'firing', labels = ?, fingerprint = ?, severity = ?, "
                 "last_fired_at = ? WHERE id = ?", (json.dumps(labels), fingerprint, severity, now, alert_id))


def to_send(conn: sqlite3.Connection, alert_id: int) -> AlertToSend:
    rid, closed_at, labels_text, fp, severity, target = conn.execute(
        "SELECT regression_id, closed_at, labels, fingerprint, severity, target FROM alerts WHERE id = ?",
        (alert_id,)).fetchone()
    return AlertToSend(_regression(conn, rid, closed_at), json.loads(labels_text), fp, severity, target)
