"""A store written by an earlier release (schema version 4, tests/agent/fixtures/store_v4) opens with today's code,
migrates in place and answers exactly as that release did: windows, profiles, aggregates, regressions, detector
state, alerts and their notifications, the minute rollup, and the page's JSON over them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.store import Store
from tests.agent.fixtures.store_v4 import ANSWERS, DB_DIR, answers, copy_to


def test_the_fixture_is_the_old_schema() -> None:
    conn = sqlite3.connect(f"file:{DB_DIR / 'infersight.db'}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone() == (4,)
        assert conn.execute("SELECT COUNT(*) FROM windows").fetchone() == (60,)
    finally:
        conn.close()


def test_an_old_store_migrates_in_place_and_answers_byte_for_byte(tmp_path: Path) -> None:
    directory = copy_to(tmp_path / "store")
    with Store.open(directory) as store:
        migrated = store.schema_version()
    got = answers(directory)
    expected = ANSWERS.read_text().rstrip("\n")
    assert migrated >= 4
    if got != expected:
        # Name the first answer that differs, not a 260 KB diff.
        import json

        old, new = json.loads(expected), json.loads(got)
        differing = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        raise AssertionError(f"answers changed after migration: {differing}")
