"""What the detector keeps: its learned state per target, the regressions it opened (re-ranked while open), and
durable requests to forget a baseline. The codec of a regression is analysis.regression's dict, as JSON.

The regressions table is the one copy of an episode: an alert (agent.store.alerts) holds its id and reads it
from here (`regression_in`) when it builds a notification. A row marked `test` is the synthetic episode of an
`infersight alert test` run: it exists for its alert only and no listing shows it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from agent.store.db import Migration
from analysis.regression import Regression, regression_from_dict, regression_to_dict

MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, "detector baselines, regressions, baseline reset requests", """
        CREATE TABLE detector_state (
            target TEXT PRIMARY KEY,
            -- What the detector learned for: the served program (command line); a change resets it.
            identity TEXT NOT NULL,
            updated REAL NOT NULL,
            -- LatencyDetector.get_state() as JSON.
            state TEXT NOT NULL
        );
        CREATE TABLE regressions (
            id TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            opened_at REAL NOT NULL,
            closed_at REAL,
            severity TEXT NOT NULL,
            top_cause TEXT NOT NULL,
            -- analysis.regression.regression_to_dict() as JSON.
            data TEXT NOT NULL
        );
        CREATE INDEX regressions_by_target ON regressions(target, opened_at);
        CREATE TABLE baseline_resets (
            id INTEGER PRIMARY KEY,
            target TEXT NOT NULL,
            requested REAL NOT NULL
        );
    """),
    Migration(5, "regressions: mark the synthetic episodes of 'infersight alert test'", """
        ALTER TABLE regressions ADD COLUMN test INTEGER NOT NULL DEFAULT 0 CHECK (test IN (0, 1));
    """),
)


def encode_regression(regression: Regression) -> str:
    return json.dumps(regression_to_dict(regression), separators=(",", ":"), sort_keys=True)


def decode_regression(text: str) -> Regression:
    return regression_from_dict(json.loads(text))


def upsert_regression(conn: sqlite3.Connection, regression: Regression, *, test: bool = False) -> None:
    """Insert or update one episode inside the caller's transaction."""
    conn.execute("INSERT INTO regressions(id, target, opened_at, closed_at, severity, top_cause, data, test) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET closed_at = excluded.closed_at, "
                 "severity = excluded.severity, top_cause = excluded.top_cause, data = excluded.data",
                 (regression.id, regression.target, regression.opened_at, regression.closed_at,
                  regression.severity, regression.top_cause, encode_regression(regression), int(test)))


def regression_in(conn: sqlite3.Connection, regression_id: str) -> Regression | None:
    """The episode as last saved, test ones included (an alert's read inside the alerter's transaction)."""
    row = conn.execute("SELECT data FROM regressions WHERE id = ?", (regression_id,)).fetchone()
    return decode_regression(row[0]) if row else None


class FindingTables:
    """Store's detector state, regressions and baseline resets (mixed into agent.store.Store)."""

    _clock: Callable[[], float]

    def save_detector_state(self, target: str, identity: str, state: dict) -> None:
        with self.transaction() as conn:
            conn.execute("INSERT INTO detector_state(target, identity, updated, state) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT(target) DO UPDATE SET identity = excluded.identity, "
                         "updated = excluded.updated, state = excluded.state",
                         (target, identity, self._clock(), json.dumps(state, separators=(",", ":"))))

    def delete_detector_state(self, target: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM detector_state WHERE target = ?", (target,))

    def save_regression(self, regression: Regression, *, test: bool = False) -> None:
        """Insert or update one episode (its causes are re-ranked while it is open). `test`: the synthetic
        episode of `infersight alert test`, kept for its alert and left out of every listing."""
        with self.transaction() as conn:
            upsert_regression(conn, regression, test=test)

    def request_baseline_reset(self, target: str) -> None:
        """Ask the running agent (or the next one) to forget `target`'s baseline; the request is durable."""
        with self.transaction() as conn:
            conn.execute("INSERT INTO baseline_resets(target, requested) VALUES (?, ?)", (target, self._clock()))
            conn.execute("DELETE FROM detector_state WHERE target = ?", (target,))

    def take_baseline_resets(self) -> list[str]:
        """The targets whose reset was requested since the last call; the requests are consumed."""
        with self.transaction() as conn:
            rows = conn.execute("SELECT DISTINCT target FROM baseline_resets").fetchall()
            conn.execute("DELETE FROM baseline_resets")
        return [r[0] for r in rows]

    def detector_state(self, target: str) -> tuple[str, dict] | None:
        """(identity, state) saved for `target`, or None."""
        row = self._reader().execute("SELECT identity, state FROM detector_state WHERE target = ?",
                                     (target,)).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def regressions(self, target: str | None = None, *, open_only: bool = False, since: float | None = None,
                    limit: int = 100) -> list[Regression]:
        """Episodes newest first: those still open or that closed after `since`."""
        clauses, params = ["NOT test"], []
        if target is not None:
            clauses.append("target = ?")
            params.append(target)
        if open_only:
            clauses.append("closed_at IS NULL")
        if since is not None:
            clauses.append("(closed_at IS NULL OR closed_at > ?)")
            params.append(since)
        rows = self._reader().execute(
            f"SELECT data FROM regressions WHERE {' AND '.join(clauses)} ORDER BY opened_at DESC, id LIMIT ?",
            [*params, int(limit)]).fetchall()
        return [decode_regression(r[0]) for r in rows]

    def regression(self, regression_id: str) -> Regression | None:
        row = self._reader().execute("SELECT data FROM regressions WHERE id = ? AND NOT test",
                                     (regression_id,)).fetchone()
        return decode_regression(row[0]) if row else None
