"""The on-disk history in SQLite (WAL): one module per table family, each owning its migrations, SQL and codec.

`windows` (windows, profiles, aggregates, retention), `findings` (detector state, regressions, baseline
resets), `alerts` (the alert outbox), `rollup` (the minute rollup), `changes` (target identities and their changes); `db` opens the file, migrates it in
order and holds the one write path, `Store.transaction()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.config import DEFAULT_STORE_DIR
from agent.store import alerts, changes, findings, rollup, windows
from agent.store.changes import ChangeTables, StoredChange
from agent.store.db import DB_NAME, Database, Migration, ReadOnlyDatabase, StoreError, open_database, open_store_dir
from agent.store.findings import FindingTables
from agent.store.rollup import RollupTables
from agent.store.windows import (
    PROFILE_KINDS,
    BucketAggregate,
    ProfileKind,
    RetentionResult,
    StoredTarget,
    WindowTables,
    decode_folded,
    encode_folded,
)

# Ordered by version across the families; never edit a released entry. A new table is one more
# Migration(version=N+1, ...) in its family's module, appended here.
MIGRATIONS: tuple[Migration, ...] = tuple(sorted(
    windows.MIGRATIONS + findings.MIGRATIONS + alerts.MIGRATIONS + rollup.MIGRATIONS
    + changes.MIGRATIONS, key=lambda m: m.version))

__all__ = ["DB_NAME", "MIGRATIONS", "PROFILE_KINDS", "BucketAggregate", "Migration", "ProfileKind",
           "ReadOnlyStore", "RetentionResult", "Store", "StoreError", "StoredChange", "StoredTarget", "decode_folded", "encode_folded",
           "open_store_dir"]


class Store(WindowTables, FindingTables, RollupTables, ChangeTables, Database):
    """The agent's store: every family's reads and writes over one writer connection and per-thread readers."""

    @classmethod
    def open(cls, directory: Path = DEFAULT_STORE_DIR, *, migrations: Iterable[Migration] = MIGRATIONS,
             clock: Callable[[], float] = time.time) -> Store:
        """Open (creating, mode 0700) the store in `directory` and migrate it to the newest schema.

        The directory and every parent must be closed to other users, checked on what is opened
        (`open_store_dir`); otherwise UntrustedPath.
        """
        path, conn = open_database(Path(directory), tuple(migrations))
        return cls(path, conn, clock)

    def read_only(self) -> ReadOnlyStore:
        """A handle on the same file whose every connection is read-only: what the status page gets."""
        return ReadOnlyStore(self.path, self._clock)


class ReadOnlyStore(WindowTables, FindingTables, RollupTables, ChangeTables, ReadOnlyDatabase):
    """The store's reads over read-only connections (dashboards.reader.StoreReader); any write fails."""
