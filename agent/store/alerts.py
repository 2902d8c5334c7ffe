"""The alert outbox's tables: one alert per regression episode, and the notifications queued for its receivers."""

from __future__ import annotations

from agent.store.db import Migration

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
)
