"""Windows and their compressed profiles: the schema, the codec (JSON without stacks + zlib folded text),
writing, reading, aggregating in SQLite and retention."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.store.db import Migration
from analysis.flamegraph.stored import FoldedRead
from analysis.window import Window

ProfileKind = Literal["active", "idle", "offcpu"]
PROFILE_KINDS: tuple[str, ...] = ("active", "idle", "offcpu")
# A JSON path into a stored window, or sum(path) over an object's values; names only, so safe to inline in SQL.
_FIELD_RE = re.compile(r"(\$(?:\.[a-z_][a-z0-9_]*)+)|sum\((\$(?:\.[a-z_][a-z0-9_]*)+)\)")

# Ordered with the other families' in agent.store.MIGRATIONS; never edit a released entry.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "targets, windows, profiles", """
        CREATE TABLE targets (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE
        );
        CREATE TABLE windows (
            id INTEGER PRIMARY KEY,
            target_id INTEGER NOT NULL REFERENCES targets(id),
            pid INTEGER NOT NULL,
            start REAL NOT NULL,
            "end" REAL NOT NULL,
            -- Window.to_json() with the folded stacks moved out to profiles.
            data TEXT NOT NULL
        );
        CREATE INDEX windows_by_target ON windows(target_id, start);
        CREATE INDEX windows_by_end ON windows("end");
        CREATE TABLE profiles (
            window_id INTEGER NOT NULL REFERENCES windows(id) ON DELETE CASCADE,
            kind TEXT NOT NULL CHECK (kind IN ('active', 'idle', 'offcpu')),
            -- zlib of folded text: one "frame;frame;frame count" per line.
            folded BLOB NOT NULL,
            PRIMARY KEY (window_id, kind)
        );
    """),
)


@dataclass(frozen=True)
class StoredTarget:
    name: str
    windows: int
    first_start: float
    last_end: float


@dataclass(frozen=True)
class BucketAggregate:
    """Store.aggregate()'s answer for one time bucket: per field, the sum, non-null count and max of its windows."""

    start: float
    windows: int
    seconds: float
    sums: dict[str, float | None]
    counts: dict[str, int]
    maxes: dict[str, float | None]


@dataclass(frozen=True)
class RetentionResult:
    deleted_windows: int
    bytes_before: int
    bytes_after: int


def encode_folded(stacks: dict[str, int]) -> bytes:
    return zlib.compress("".join(f"{k} {v}\n" for k, v in stacks.items()).encode(), 6)


def decode_folded(blob: bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in zlib.decompress(blob).decode().splitlines():
        stack, _, count = line.rpartition(" ")
        out[stack] = out.get(stack, 0) + int(count)
    return out


def _split_profiles(window: Window) -> tuple[dict, dict[str, dict[str, int]]]:
    """The window as a dict without its folded stacks, and those stacks by profile kind."""
    data = window.to_dict()
    profiles: dict[str, dict[str, int]] = {}
    if data.get("stacks"):
        profiles["active"] = data["stacks"].pop("active") or {}
        profiles["idle"] = data["stacks"].pop("idle") or {}
    if data.get("offcpu"):
        profiles["offcpu"] = data["offcpu"].pop("stacks") or {}
    return data, {k: v for k, v in profiles.items() if v}


def _join(text: str, blobs: dict[str, bytes], with_profiles: bool) -> Window:
    data = json.loads(text)
    if data.get("stacks") is not None:
        data["stacks"]["active"] = decode_folded(blobs["active"]) if with_profiles and "active" in blobs else {}
        data["stacks"]["idle"] = decode_folded(blobs["idle"]) if with_profiles and "idle" in blobs else {}
    if data.get("offcpu") is not None:
        data["offcpu"]["stacks"] = decode_folded(blobs["offcpu"]) if with_profiles and "offcpu" in blobs else {}
    return Window.from_dict(data)


def _filters(target: str | None, since: float | None, until: float | None) -> tuple[str, list]:
    clauses, params = ["1"], []
    if target is not None:
        clauses.append("t.name = ?")
        params.append(target)
    if since is not None:
        clauses.append('w."end" > ?')
        params.append(since)
    if until is not None:
        clauses.append("w.start < ?")
        params.append(until)
    return "WHERE " + " AND ".join(clauses), params


class WindowTables:
    """Store's windows, profiles and targets (mixed into agent.store.Store, which provides the connections)."""

    path: Path
    _clock: Callable[[], float]
    _write: sqlite3.Connection

    def add_window(self, window: Window) -> int:
        """Store one window and its profiles in one transaction; returns its id once committed."""
        data, profiles = _split_profiles(window)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        blobs = [(kind, encode_folded(stacks)) for kind, stacks in profiles.items()]
        with self.transaction() as conn:
            conn.execute("INSERT INTO targets(name) VALUES (?) ON CONFLICT(name) DO NOTHING", (window.target,))
            cur = conn.execute(
                'INSERT INTO windows(target_id, pid, start, "end", data) '
                "VALUES ((SELECT id FROM targets WHERE name = ?), ?, ?, ?, ?)",
                (window.target, window.pid, window.start, window.end, text))
            window_id = int(cur.lastrowid)
            conn.executemany("INSERT INTO profiles(window_id, kind, folded) VALUES (?, ?, ?)",
                             [(window_id, kind, blob) for kind, blob in blobs])
        return window_id

    def apply_retention(self, now: float | None = None, max_age_s: float = math.inf,
                        max_bytes: int | None = None) -> RetentionResult:
        """Delete windows that ended before now - max_age_s, then the oldest until the file fits max_bytes.

        `now` defaults to the store's clock. Freed pages go back to the OS (incremental vacuum, WAL truncated),
        so the cost is proportional to what was deleted, never a full VACUUM.
        """
        now = self._clock() if now is None else now
        with self._lock:
            conn = self._write
            before = self.size_bytes()
            deleted = self._delete_where('"end" < ?', (now - max_age_s,)) if math.isfinite(max_age_s) else 0
            while max_bytes is not None and self._used_bytes() > max_bytes:
                remaining = conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0]
                if remaining == 0:
                    break
                used = self._used_bytes()
                # Delete in proportion to the excess so a large cut takes a few rounds, not thousands.
                batch = max(1, int(remaining * (used - max_bytes) / used))
                deleted += self._delete_where(
                    "id IN (SELECT id FROM windows ORDER BY start, id LIMIT ?)", (batch,))
            if deleted:
                # execute() steps this pragma once (one page); executescript() runs it to the end.
                conn.executescript("PRAGMA incremental_vacuum;")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return RetentionResult(deleted_windows=deleted, bytes_before=before, bytes_after=self.size_bytes())

    def _delete_where(self, where: str, params: tuple) -> int:
        with self.transaction() as conn:
            conn.execute(f"DELETE FROM profiles WHERE window_id IN (SELECT id FROM windows WHERE {where})", params)
            return conn.execute(f"DELETE FROM windows WHERE {where}", params).rowcount

    def _used_bytes(self) -> int:
        page_size, pages, free = (self._write.execute(f"PRAGMA {p}").fetchone()[0]
                                  for p in ("page_size", "page_count", "freelist_count"))
        return page_size * (pages - free)

    def windows(self, target: str | None = None, since: float | None = None, until: float | None = None,
                limit: int | None = None, *, with_profiles: bool = True) -> list[Window]:
        """Windows overlapping [since, until), oldest first; with limit, the newest `limit` of them."""
        where, params = _filters(target, since, until)
        sql = (f'SELECT w.id, w.data FROM windows w JOIN targets t ON t.id = w.target_id {where} '
               f"ORDER BY w.start DESC, w.id DESC")
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            rows = conn.execute(sql, params).fetchall()[::-1]
            profiles: dict[int, dict[str, bytes]] = {}
            if with_profiles and rows:
                ids = [r[0] for r in rows]
                for chunk in range(0, len(ids), 500):
                    part = ids[chunk:chunk + 500]
                    for wid, kind, blob in conn.execute(
                            f"SELECT window_id, kind, folded FROM profiles WHERE window_id IN "
                            f"({','.join('?' * len(part))})", part):
                        profiles.setdefault(wid, {})[kind] = blob
        finally:
            conn.execute("COMMIT")
        return [_join(data, profiles.get(wid, {}), with_profiles) for wid, data in rows]

    def aggregate(self, target: str, since: float, until: float, bucket_seconds: float,
                  fields: Mapping[str, str]) -> list[BucketAggregate]:
        """The target's windows starting in [since, until) grouped into buckets of `bucket_seconds` (aligned to
        multiples of it), oldest first. `fields` maps a name to a JSON path in the stored window ("$.gc.pause_seconds")
        or to "sum($.path)", the sum of an object's values; each gets its sum, non-null count and max per bucket.
        Computed inside SQLite: the page asks for weeks of windows and must not decode each in Python."""
        if not bucket_seconds > 0:
            raise ValueError(f"bucket_seconds must be > 0, got {bucket_seconds!r}")
        columns = []
        for name, spec in fields.items():
            m = _FIELD_RE.fullmatch(spec)
            if m is None:
                raise ValueError(f"field {name!r} must be a JSON path like '$.gc.pause_seconds' or 'sum($.path)', "
                                 f"got {spec!r}")
            path = m.group(1) or m.group(2)
            columns.append(f"(SELECT sum(value) FROM json_each(w.data, '{path}'))" if m.group(2)
                           else f"json_extract(w.data, '{path}')")
        inner = ", ".join(f"{c} AS f{i}" for i, c in enumerate(columns))
        outer = ", ".join(f"sum(f{i}), count(f{i}), max(f{i})" for i in range(len(columns)))
        sql = (f'SELECT CAST(start / ? AS INTEGER) AS b, count(*), sum("end" - start){", " + outer if outer else ""} '
               f'FROM (SELECT w.start AS start, w."end" AS "end"{", " + inner if inner else ""} FROM windows w '
               f"JOIN targets t ON t.id = w.target_id WHERE t.name = ? AND w.start >= ? AND w.start < ?) "
               f"GROUP BY b ORDER BY b")
        rows = self._reader().execute(sql, (bucket_seconds, target, since, until)).fetchall()
        names = list(fields)
        return [BucketAggregate(start=b * bucket_seconds, windows=n, seconds=secs,
                                sums={k: row[3 + 3 * i] for i, k in enumerate(names)},
                                counts={k: row[4 + 3 * i] for i, k in enumerate(names)},
                                maxes={k: row[5 + 3 * i] for i, k in enumerate(names)})
                for row in rows for b, n, secs in [row[:3]]]

    def latest(self, target: str) -> Window | None:
        found = self.windows(target=target, limit=1)
        return found[0] if found else None

    def profiles(self, target: str, since: float | None = None, until: float | None = None,
                 kind: ProfileKind = "active") -> dict[str, int]:
        """Folded stacks of one kind summed over the target's windows overlapping [since, until), unbounded
        (tests and tools on a known store; anything serving requests reads with read_profiles' bounds)."""
        return self.read_profiles(target, since, until, kind).stacks

    def read_profiles(self, target: str, since: float | None = None, until: float | None = None,
                      kind: ProfileKind = "active", *, max_stacks: int | None = None,
                      max_span: float | None = None, deadline: float | None = None,
                      clock: Callable[[], float] = time.monotonic) -> FoldedRead:
        """Folded stacks of one kind summed over the target's windows overlapping [since, until), newest first.

        The bounds hold while reading, not after: past `max_stacks` distinct stacks a new stack's samples are
        only counted (a long range of a process with ever-new frame names once grew the agent by 2 GB);
        only the newest `max_span` seconds of the range's windows are read; at `deadline` (on `clock`) the read stops.
        A read cut short by either says from where its stacks hold the range (`read_from`, `cut`).
        """
        if kind not in PROFILE_KINDS:
            raise ValueError(f"profile kind must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")
        conn = self._reader()
        cut: str | None = None
        read_from: float | None = None
        if max_span is not None:
            # The newest day of what the range holds, not of the range: `to` may lie in the future.
            where, params = _filters(target, since, until)
            top = conn.execute(f'SELECT MAX(w."end") FROM windows w JOIN targets t ON t.id = w.target_id {where}',
                               params).fetchone()[0]
            if until is not None and top is not None:
                top = min(top, until)
            if top is not None and (since is None or since < top - max_span):
                where, params = _filters(target, since, top - max_span)
                older = conn.execute(f'SELECT 1 FROM windows w JOIN targets t ON t.id = w.target_id {where} '
                                     f'AND w."end" <= ? LIMIT 1', [*params, top - max_span]).fetchone()
                since = top - max_span
                if older is not None:
                    cut, read_from = "span", since
        where, params = _filters(target, since, until)
        merged: dict[str, int] = {}
        windows = dropped_stacks = dropped_samples = 0
        oldest: float | None = None
        rows = conn.execute(f"SELECT w.start, p.folded FROM profiles p JOIN windows w ON w.id = p.window_id "
                            f"JOIN targets t ON t.id = w.target_id {where} AND p.kind = ? "
                            f"ORDER BY w.start DESC, w.id DESC", [*params, kind])
        for start, blob in rows:
            if deadline is not None and oldest is not None and clock() >= deadline:
                cut, read_from = "time", oldest
                break
            for stack, count in decode_folded(blob).items():
                if stack in merged:
                    merged[stack] += count
                elif max_stacks is None or len(merged) < max_stacks:
                    merged[stack] = count
                else:
                    dropped_stacks += 1
                    dropped_samples += count
            windows += 1
            oldest = start
        rows.close()
        return FoldedRead(stacks=merged, windows=windows, dropped_stacks=dropped_stacks,
                          dropped_samples=dropped_samples, read_from=read_from, cut=cut)

    def first_start(self, target: str) -> float | None:
        """When the target's oldest stored window began (one index lookup), or None when it has none."""
        (start,), = self._reader().execute(
            "SELECT MIN(w.start) FROM windows w JOIN targets t ON t.id = w.target_id WHERE t.name = ?",
            (target,)).fetchall()
        return start

    def targets(self) -> list[StoredTarget]:
        rows = self._reader().execute(
            'SELECT t.name, COUNT(w.id), MIN(w.start), MAX(w."end") FROM targets t '
            "JOIN windows w ON w.target_id = t.id GROUP BY t.id ORDER BY t.name").fetchall()
        return [StoredTarget(name=n, windows=c, first_start=s, last_end=e) for n, c, s, e in rows]

