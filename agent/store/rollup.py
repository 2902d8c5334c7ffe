"""The minute rollup of the windows, for the page's long ranges: rolled-up minutes and each target's progress mark."""

from __future__ import annotations

import json
from collections.abc import Iterable

from agent.store.db import Migration

MIGRATIONS: tuple[Migration, ...] = (
    Migration(4, "minute rollup of the windows for the page's long ranges", """
        CREATE TABLE minute_rollup (
            target TEXT NOT NULL,
            start REAL NOT NULL,
            -- {"windows", "seconds", "sums", "counts", "maxes"} of the windows starting in this minute.
            data TEXT NOT NULL,
            PRIMARY KEY (target, start)
        ) WITHOUT ROWID;
        CREATE TABLE minute_rollup_progress (
            target TEXT PRIMARY KEY,
            -- Every minute before this one is rolled up (a minute with no window has no row).
            done_until REAL NOT NULL,
            -- The fields rolled up: a different set makes the rows stale, and they are rebuilt.
            fields TEXT NOT NULL
        );
    """),
)


class RollupTables:
    """Store's minute rollup (mixed into agent.store.Store)."""

    def rollup_progress(self, target: str) -> tuple[float, str] | None:
        """(done_until, fields) of the target's minute rollup, or None when nothing was rolled up."""
        row = self._reader().execute("SELECT done_until, fields FROM minute_rollup_progress WHERE target = ?",
                                     (target,)).fetchone()
        return (row[0], row[1]) if row else None

    def rollup_minutes(self, target: str, since: float, until: float) -> list[dict]:
        """Rolled-up minutes starting in [since, until), oldest first, each {"start", "windows", "seconds",
        "sums", "counts", "maxes"}."""
        rows = self._reader().execute(
            "SELECT start, data FROM minute_rollup WHERE target = ? AND start >= ? AND start < ? ORDER BY start",
            (target, since, until)).fetchall()
        return [{"start": start, **json.loads(data)} for start, data in rows]

    def save_rollup(self, target: str, minutes: Iterable[dict], done_until: float, fields: str,
                    keep_since: float) -> None:
        """Upsert rolled-up minutes, move the target's progress mark to `done_until` and drop minutes before
        `keep_since`, in one transaction. A mark for other `fields` means stale rows: they are replaced."""
        with self.transaction() as conn:
            row = conn.execute("SELECT fields FROM minute_rollup_progress WHERE target = ?", (target,)).fetchone()
            if row is not None and row[0] != fields:
                conn.execute("DELETE FROM minute_rollup WHERE target = ?", (target,))
            conn.executemany(
                "INSERT INTO minute_rollup(target, start, data) VALUES (?, ?, ?) "
                "ON CONFLICT(target, start) DO UPDATE SET data = excluded.data",
                [(target, m["start"], json.dumps({k: v for k, v in m.items() if k != "start"},
                                                 separators=(",", ":"))) for m in minutes])
            conn.execute("INSERT INTO minute_rollup_progress(target, done_until, fields) VALUES (?, ?, ?) "
                         "ON CONFLICT(target) DO UPDATE SET done_until = excluded.done_until, "
                         "fields = excluded.fields", (target, done_until, fields))
            conn.execute("DELETE FROM minute_rollup WHERE target = ? AND start < ?", (target, keep_since))
