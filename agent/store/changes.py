"""A target's identity (what it runs) and its changes: the last settled identity per target, and one `changes` row
each time a settled identity differed from the one before (docs/changes.md). The codec is agent.identity's dict, as
JSON; allowlisted environment values are the only ones it holds."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from agent.store.db import Migration

MIGRATIONS: tuple[Migration, ...] = (
    Migration(7, "target identities and their changes", """
        CREATE TABLE target_identities (
            target TEXT PRIMARY KEY,
            pid INTEGER NOT NULL,
            start_time INTEGER NOT NULL,
            since REAL NOT NULL,
            -- agent.identity.Identity.to_dict() as JSON.
            identity TEXT NOT NULL
        );
        CREATE TABLE changes (
            id TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            at REAL NOT NULL,
            pid INTEGER NOT NULL,
            before TEXT NOT NULL,
            after TEXT NOT NULL,
            -- [{"part", "before", "after"}] as JSON, the part most likely to matter first.
            diff TEXT NOT NULL,
            -- When the agent saw it (the new process settled): `at` is when it began (the process started).
            seen_at REAL NOT NULL
        );
        CREATE INDEX changes_by_target ON changes(target, at);
    """),
)


@dataclass(frozen=True)
class StoredChange:
    id: str
    target: str
    at: float
    pid: int
    before: dict
    after: dict
    diff: list[dict]
    seen_at: float | None = None  # None: seen at `at`

    def to_dict(self) -> dict:
        return {"id": self.id, "target": self.target, "at": self.at, "seen_at": self.seen_at or self.at,
                "pid": self.pid, "diff": self.diff, "before": self.before, "after": self.after}


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class ChangeTables:
    """Store's target identities and changes (mixed into agent.store.Store)."""

    _clock: Callable[[], float]

    def settle_identity(self, target: str, pid: int, start_time: int, since: float, identity: dict,
                        change: StoredChange | None) -> None:
        """Save `target`'s settled identity and, when it differs from the last one, its change: one transaction."""
        with self.transaction() as conn:
            # `since` is when this identity began: a restart with the same identity keeps it.
            conn.execute("INSERT INTO target_identities(target, pid, start_time, since, identity) "
                         "VALUES (?, ?, ?, ?, ?) ON CONFLICT(target) DO UPDATE SET pid = excluded.pid, "
                         "start_time = excluded.start_time, identity = excluded.identity, "
                         "since = CASE WHEN ? THEN excluded.since ELSE target_identities.since END",
                         (target, pid, start_time, since, _dumps(identity), change is not None))
            if change is not None:
                _insert_change(conn, change)

    def forget_identity(self, target: str) -> None:
        """Drop a per-process target's (`name#pid`) settled identity: that name never comes back."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM target_identities WHERE target = ?", (target,))

    def target_identity(self, target: str) -> tuple[int, int, dict] | None:
        """(pid, start time, identity) last settled for `target`, or None."""
        row = self._reader().execute("SELECT pid, start_time, identity FROM target_identities WHERE target = ?",
                                     (target,)).fetchone()
        return (row[0], row[1], json.loads(row[2])) if row else None

    def changes(self, target: str | None = None, *, since: float | None = None, until: float | None = None,
                limit: int = 100) -> list[StoredChange]:
        """Changes newest first."""
        clauses, params = ["1"], []
        for clause, value in (("target = ?", target), ("at >= ?", since), ("at <= ?", until)):
            if value is not None:
                clauses.append(clause)
                params.append(value)
        rows = self._reader().execute(
            f"SELECT id, target, at, pid, before, after, diff, seen_at FROM changes WHERE {' AND '.join(clauses)} "
            "ORDER BY at DESC, id LIMIT ?", [*params, int(limit)]).fetchall()
        return [_decode(r) for r in rows]

    def change(self, change_id: str) -> StoredChange | None:
        row = self._reader().execute("SELECT id, target, at, pid, before, after, diff, seen_at FROM changes WHERE id = ?",
                                     (change_id,)).fetchone()
        return _decode(row) if row else None

    def identities_since(self) -> dict[str, float]:
        """Target -> when its current identity began: its newest change, else when it was first recorded."""
        return dict(self._reader().execute("SELECT target, since FROM target_identities").fetchall())


def _insert_change(conn: sqlite3.Connection, change: StoredChange) -> None:
    conn.execute("INSERT INTO changes(id, target, at, pid, before, after, diff, seen_at) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (change.id, change.target, change.at, change.pid, _dumps(change.before), _dumps(change.after),
                  _dumps(change.diff), change.seen_at if change.seen_at is not None else change.at))


def _decode(row: tuple) -> StoredChange:
    return StoredChange(id=row[0], target=row[1], at=row[2], pid=row[3], before=json.loads(row[4]),
                        after=json.loads(row[5]), diff=json.loads(row[6]), seen_at=row[7])
