"""The on-disk history: windows and compressed profiles in SQLite (WAL), with ordered schema migrations.

Durability: WAL with synchronous=FULL. Once add_window() returns, the commit is in the WAL file and fsynced,
so neither `kill -9` of the agent nor a power cut loses it (WAL + NORMAL would survive only the former).
The cost is one fsync per window per target, a few per interval.

Threads: the daemon writes from one thread (retention may run on another), the web page reads from others.
Writes share one connection behind a lock; every reading thread gets its own connection, and WAL lets
readers run while a write is in progress, each query seeing the last committed state.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sqlite3
import stat as stat_mod
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

from agent.config import DEFAULT_STORE_DIR, open_trusted
from analysis.flamegraph.stored import FoldedRead
from analysis.regression import Regression, regression_from_dict, regression_to_dict
from analysis.window import Window

DB_NAME = "infersight.db"
ProfileKind = Literal["active", "idle", "offcpu"]
PROFILE_KINDS: tuple[str, ...] = ("active", "idle", "offcpu")
# A JSON path into a stored window, or sum(path) over an object's values; names only, so safe to inline in SQL.
_FIELD_RE = re.compile(r"(\$(?:\.[a-z_][a-z0-9_]*)+)|sum\((\$(?:\.[a-z_][a-z0-9_]*)+)\)")


class StoreError(RuntimeError):
    """The store cannot be opened or used (newer schema, failed migration, corrupt data)."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    sql: str


# Ordered; never edit a released entry. A new table is one more Migration(version=N+1, ...) at the end.
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


def _owner_only(directory: int) -> None:
    """Create the database file 0600 (or make an existing one so) before SQLite opens it: SQLite gives its
    -wal and -shm files the database's mode, and the umask or a 0755 directory must not decide who reads
    the history (command lines, stacks). Relative to the checked directory's descriptor, never following links."""
    fd = os.open(DB_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                 dir_fd=directory)
    try:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        try:
            os.chmod(f"{DB_NAME}{suffix}", 0o600, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            pass


def open_store_dir(directory: Path) -> tuple[Path, int]:
    """Create (0700) and vet the store directory on what is opened, not only its path: the resolved path and
    an open descriptor of it (the caller closes it). UntrustedPath when another user could write it or any
    parent, or swapped a component in between (agent.config.open_trusted)."""
    try:
        fd = open_trusted(directory, what="store directory", directory=True, create=True)
    except OSError as exc:
        raise StoreError(f"cannot create store directory {str(directory)!r}: {exc.strerror}") from None
    # The kernel's name for what was opened: every symlink resolved, so SQLite's path has none to follow.
    return Path(os.readlink(f"/proc/self/fd/{fd}")), fd


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every write below says BEGIN IMMEDIATE / COMMIT.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    # Takes effect only on a database without tables, so it must precede journal_mode, which writes the
    # header; lets retention give freed pages back to the OS. A no-op on an existing store.
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


class Store:
    def __init__(self, path: Path, conn: sqlite3.Connection, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._write = conn
        self._lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._closed = False

    @classmethod
    def open(cls, directory: Path = DEFAULT_STORE_DIR, *, migrations: Iterable[Migration] = MIGRATIONS,
             clock: Callable[[], float] = time.time) -> Store:
        """Open (creating, mode 0700) the store in `directory` and migrate it to the newest schema.

        The directory and every parent must be closed to other users, checked on what is opened
        (`open_store_dir`); otherwise UntrustedPath.
        """
        directory = Path(directory)
        real, dir_fd = open_store_dir(directory)
        path = real / DB_NAME
        try:
            try:
                _owner_only(dir_fd)
            except OSError as exc:
                raise StoreError(f"cannot create store {str(path)!r}: {exc.strerror}") from None
            try:
                conn = _connect(path)
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"cannot open store {str(path)!r}: {exc}") from None
            # SQLite opens by path. Every component of it was checked on its descriptor, so no other user can
            # change it now; this says so for the one SQLite used.
            if not os.path.samestat(os.stat(real), os.fstat(dir_fd)):
                conn.close()
                raise StoreError(f"store directory {str(directory)!r} changed while it was opened; not using it")
        finally:
            os.close(dir_fd)
        try:
            _migrate(conn, tuple(migrations), path)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"cannot open store {str(path)!r}: {exc}") from None
        except StoreError:
            conn.close()
            raise
        return cls(path, conn, clock)

    # ---- writing (serialized by the lock) ---------------------------------------------------------------

    def add_window(self, window: Window) -> int:
        """Store one window and its profiles in one transaction; returns its id once committed."""
        data, profiles = _split_profiles(window)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        blobs = [(kind, encode_folded(stacks)) for kind, stacks in profiles.items()]
        with self._lock:
            conn = self._write
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT INTO targets(name) VALUES (?) ON CONFLICT(name) DO NOTHING", (window.target,))
                cur = conn.execute(
                    'INSERT INTO windows(target_id, pid, start, "end", data) '
                    "VALUES ((SELECT id FROM targets WHERE name = ?), ?, ?, ?, ?)",
                    (window.target, window.pid, window.start, window.end, text))
                window_id = int(cur.lastrowid)
                conn.executemany("INSERT INTO profiles(window_id, kind, folded) VALUES (?, ?, ?)",
                                 [(window_id, kind, blob) for kind, blob in blobs])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
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

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE .. COMMIT, ROLLBACK on error) for another module's tables,
        such as the alert outbox, so every write still goes through this one connection and lock."""
        with self._lock:
            conn = self._write
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _delete_where(self, where: str, params: tuple) -> int:
        conn = self._write
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(f"DELETE FROM profiles WHERE window_id IN (SELECT id FROM windows WHERE {where})", params)
            n = conn.execute(f"DELETE FROM windows WHERE {where}", params).rowcount
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return n

    def _used_bytes(self) -> int:
        page_size, pages, free = (self._write.execute(f"PRAGMA {p}").fetchone()[0]
                                  for p in ("page_size", "page_count", "freelist_count"))
        return page_size * (pages - free)

    def size_bytes(self) -> int:
        """Bytes on disk: the database file plus its WAL."""
        return sum(os.stat(p).st_size for p in (self.path, Path(f"{self.path}-wal")) if os.path.exists(p))

    def _commit(self, statements: Iterable[tuple[str, tuple]]) -> None:
        with self._lock:
            conn = self._write
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    conn.execute(sql, params)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def save_detector_state(self, target: str, identity: str, state: dict) -> None:
        self._commit([("INSERT INTO detector_state(target, identity, updated, state) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT(target) DO UPDATE SET identity = excluded.identity, "
                       "updated = excluded.updated, state = excluded.state",
                       (target, identity, self._clock(), json.dumps(state, separators=(",", ":"))))])

    def delete_detector_state(self, target: str) -> None:
        self._commit([("DELETE FROM detector_state WHERE target = ?", (target,))])

    def save_regression(self, regression: Regression) -> None:
        """Insert or update one episode (its causes are re-ranked while it is open)."""
        data = json.dumps(regression_to_dict(regression), separators=(",", ":"), sort_keys=True)
        self._commit([("INSERT INTO regressions(id, target, opened_at, closed_at, severity, top_cause, data) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET closed_at = excluded.closed_at, "
                       "severity = excluded.severity, top_cause = excluded.top_cause, data = excluded.data",
                       (regression.id, regression.target, regression.opened_at, regression.closed_at,
                        regression.severity, regression.top_cause, data))])

    def request_baseline_reset(self, target: str) -> None:
        """Ask the running agent (or the next one) to forget `target`'s baseline; the request is durable."""
        self._commit([("INSERT INTO baseline_resets(target, requested) VALUES (?, ?)", (target, self._clock())),
                      ("DELETE FROM detector_state WHERE target = ?", (target,))])

    def take_baseline_resets(self) -> list[str]:
        """The targets whose reset was requested since the last call; the requests are consumed."""
        with self._lock:
            conn = self._write
            conn.execute("BEGIN IMMEDIATE")
            try:
                rows = conn.execute("SELECT DISTINCT target FROM baseline_resets").fetchall()
                conn.execute("DELETE FROM baseline_resets")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return [r[0] for r in rows]

    # ---- reading (any thread) --------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"store {str(self.path)!r} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    def query(self, sql: str, params: Iterable = ()) -> list[tuple]:
        """Rows of one read-only statement on this thread's reader connection (the last committed state)."""
        return self._reader().execute(sql, tuple(params)).fetchall()

    def schema_version(self) -> int:
        return _current_version(self._reader())

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

    def detector_state(self, target: str) -> tuple[str, dict] | None:
        """(identity, state) saved for `target`, or None."""
        row = self._reader().execute("SELECT identity, state FROM detector_state WHERE target = ?",
                                     (target,)).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def regressions(self, target: str | None = None, *, open_only: bool = False, since: float | None = None,
                    limit: int = 100) -> list[Regression]:
        """Episodes newest first: those still open or that closed after `since`."""
        clauses, params = ["1"], []
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
        return [regression_from_dict(json.loads(r[0])) for r in rows]

    def regression(self, regression_id: str) -> Regression | None:
        row = self._reader().execute("SELECT data FROM regressions WHERE id = ?", (regression_id,)).fetchone()
        return regression_from_dict(json.loads(row[0])) if row else None

    def targets(self) -> list[StoredTarget]:
        rows = self._reader().execute(
            'SELECT t.name, COUNT(w.id), MIN(w.start), MAX(w."end") FROM targets t '
            "JOIN windows w ON w.target_id = t.id GROUP BY t.id ORDER BY t.name").fetchall()
        return [StoredTarget(name=n, windows=c, first_start=s, last_end=e) for n, c, s, e in rows]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for conn in self._readers:
                conn.close()
            self._write.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def _join(text: str, blobs: dict[str, bytes], with_profiles: bool) -> Window:
    data = json.loads(text)
    if data.get("stacks") is not None:
        data["stacks"]["active"] = decode_folded(blobs["active"]) if with_profiles and "active" in blobs else {}
        data["stacks"]["idle"] = decode_folded(blobs["idle"]) if with_profiles and "idle" in blobs else {}
    if data.get("offcpu") is not None:
        data["offcpu"]["stacks"] = decode_folded(blobs["offcpu"]) if with_profiles and "offcpu" in blobs else {}
    return Window.from_dict(data)


def _current_version(conn: sqlite3.Connection) -> int:
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if not has_table:
        return 0
    return conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]


def _migrate(conn: sqlite3.Connection, migrations: tuple[Migration, ...], path: Path) -> None:
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise StoreError(f"migrations must be numbered 1..N in order, got {versions}")
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version ("
                 "version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL)")
    current = _current_version(conn)
    if current > len(migrations):
        raise StoreError(f"store {str(path)!r} has schema version {current}, newer than this infersight "
                         f"knows ({len(migrations)}); upgrade infersight or use another store_dir")
    for m in migrations[current:]:
        # executescript() would commit on its own; splitting keeps each migration one transaction.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(m.sql):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version(version, description, applied_at) VALUES (?, ?, ?)",
                         (m.version, m.description, time.time()))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise StoreError(f"store {str(path)!r}: migration {m.version} ({m.description}) failed: {exc}") from None


def _statements(script: str) -> list[str]:
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
