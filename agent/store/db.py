"""The store's SQLite file: opening it safely, the one write transaction, reader connections, ordered migrations.

Durability: WAL with synchronous=FULL. Once a write transaction commits, it is in the WAL file and fsynced,
so neither `kill -9` of the agent nor a power cut loses it (WAL + NORMAL would survive only the former).
The cost is one fsync per window per target, a few per interval.

Threads: the daemon writes from one thread (retention may run on another), the web page reads from others.
Writes share one connection behind a lock and go through `transaction()`; every reading thread gets its own
connection, and WAL lets readers run while a write is in progress, each query seeing the last committed state.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat as stat_mod
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from agent.trust import open_trusted

DB_NAME = "infersight.db"


class StoreError(RuntimeError):
    """The store cannot be opened or used (newer schema, failed migration, corrupt data)."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    sql: str


@contextmanager
def transaction(conn: sqlite3.Connection, lock: threading.RLock) -> Iterator[sqlite3.Connection]:
    """The one way the store writes: BEGIN IMMEDIATE .. COMMIT under the writer's lock, ROLLBACK on error."""
    with lock:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


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
    parent, or swapped a component in between (agent.trust.open_trusted)."""
    try:
        fd = open_trusted(directory, what="store directory", directory=True, create=True)
    except OSError as exc:
        raise StoreError(f"cannot create store directory {str(directory)!r}: {exc.strerror}") from None
    # The kernel's name for what was opened: every symlink resolved, so SQLite's path has none to follow.
    return Path(os.readlink(f"/proc/self/fd/{fd}")), fd


def connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every write goes through transaction().
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    # Takes effect only on a database without tables, so it must precede journal_mode, which writes the
    # header; lets retention give freed pages back to the OS. A no-op on an existing store.
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write: SQLite opens the file read-only (mode=ro) and refuses writes (query_only)."""
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA query_only=ON")
    return conn


def open_database(directory: Path, migrations: tuple[Migration, ...]) -> tuple[Path, sqlite3.Connection]:
    """Open (creating, mode 0700) the database in `directory` and migrate it to the newest schema.

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
            conn = connect(path)
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
        _migrate(conn, migrations, path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"cannot open store {str(path)!r}: {exc}") from None
    except StoreError:
        conn.close()
        raise
    return path, conn


class Database:
    """The connections: one writer behind a lock, one reader per thread. The table families' mixins
    (agent.store.windows, findings, alerts, rollup) add their reads and writes on top."""

    def __init__(self, path: Path, conn: sqlite3.Connection | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._write = conn
        self._lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._closed = False

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the writer connection (ROLLBACK on error): every write of the store."""
        with transaction(self._write, self._lock) as conn:
            yield conn

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"store {str(self.path)!r} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open_reader()
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        return connect(self.path)

    def query(self, sql: str, params: Iterable = ()) -> list[tuple]:
        """Rows of one read-only statement on this thread's reader connection (the last committed state)."""
        return self._reader().execute(sql, tuple(params)).fetchall()

    def schema_version(self) -> int:
        return _current_version(self._reader())

    def size_bytes(self) -> int:
        """Bytes on disk: the database file plus its WAL."""
        return sum(os.stat(p).st_size for p in (self.path, Path(f"{self.path}-wal")) if os.path.exists(p))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for conn in self._readers:
                conn.close()
            if self._write is not None:
                self._write.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    lock = threading.RLock()
    for m in migrations[current:]:
        # executescript() would commit on its own; splitting keeps each migration one transaction.
        try:
            with transaction(conn, lock):
                for statement in _statements(m.sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version(version, description, applied_at) VALUES (?, ?, ?)",
                             (m.version, m.description, time.time()))
        except sqlite3.Error as exc:
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


class ReadOnlyDatabase(Database):
    """Connections that cannot write, for the status page: each reader opens the file read-only (mode=ro,
    query_only) and there is no writer; transaction() refuses."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__(path, None, clock)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        raise StoreError(f"store {str(self.path)!r} is open read-only")
        yield  # a generator, so the refusal comes where a write would begin

    def _open_reader(self) -> sqlite3.Connection:
        return connect_read_only(self.path)
