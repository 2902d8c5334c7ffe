"""The minute rollup of the windows, for the page's long ranges: rolled-up minutes and each target's progress mark.

The agent advances it (`Rollup`, on its housekeeping thread); the page only reads it (dashboards.series), with
the fields and minute rules the page defines there.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from agent.store.db import Migration
from dashboards.series import CACHE_MAX_SECONDS, FIELDS, FIELDS_KEY, MINUTE, SETTLE_SECONDS

log = logging.getLogger("infersight.store")

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


class RollableStore(Protocol):
    def aggregate(self, target: str, since: float, until: float, bucket_seconds: float,
                  fields: Mapping[str, str]) -> list[Any]: ...

    def rollup_progress(self, target: str) -> tuple[float, str] | None: ...

    def save_rollup(self, target: str, minutes: Iterable[dict], done_until: float, fields: str,
                    keep_since: float) -> None: ...


class Rollup:
    """Minute buckets per target, persisted in the store's minute_rollup table once final.

    Decoding a week of window JSON takes seconds; reading a week of rolled-up minutes (10,080 small rows per
    target) does not. The agent advances the rollup in the background; a page request reads the stored minutes
    plus the windows since the last roll (dashboards.series.minute_buckets).
    """

    def __init__(self, store: RollableStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self.warm_error: str | None = None

    def advance(self, target: str) -> float:
        """Roll up the target's final minutes not yet stored (within the last CACHE_MAX_SECONDS); returns the
        time before which every minute is rolled up. A store that cannot be written (read-only, full) leaves the
        mark where it was: the page reads the rest straight from the windows."""
        final = math.floor((self._clock() - SETTLE_SECONDS) / MINUTE) * MINUTE
        keep = final - CACHE_MAX_SECONDS
        with self._lock:
            progress = self._store.rollup_progress(target)
            done = progress[0] if progress is not None and progress[1] == FIELDS_KEY else keep
            done = max(done, keep)
            try:
                # A day at a time: each write holds the store's writer briefly, and the agent is not starved.
                while done < final:
                    end = min(final, done + 86400.0)
                    minutes = [_minute_row(a) for a in self._store.aggregate(target, done, end, MINUTE, FIELDS)]
                    self._store.save_rollup(target, minutes, end, FIELDS_KEY, keep)
                    done = end
            except (sqlite3.Error, OSError) as exc:
                self.warm_error = f"{type(exc).__name__}: {exc}"
                log.warning("minute rollup of %s stopped at %s: %s", target, done, self.warm_error)
        return done

    def warm(self, targets: list[str]) -> None:
        """Advance every target's rollup. A failure is kept in `warm_error` and logged: the page reads what it
        needs from the windows meanwhile."""
        try:
            for target in targets:
                self.advance(target)
        except (sqlite3.Error, OSError) as exc:
            self.warm_error = f"{type(exc).__name__}: {exc}"
            log.warning("chart rollup warm-up failed: %s", self.warm_error)


def _minute_row(a: Any) -> dict[str, Any]:
    return {"start": a.start, "windows": a.windows, "seconds": a.seconds, "sums": dict(a.sums),
            "counts": dict(a.counts), "maxes": dict(a.maxes)}
