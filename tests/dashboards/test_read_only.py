"""The page's store handle cannot write: the agent hands create_app Store.read_only(), whose connections open the
file read-only; the page tests run on such a handle (tests/dashboards/conftest.py)."""

from __future__ import annotations

import sqlite3

import pytest

from agent.store import ReadOnlyStore, StoreError
from dashboards.app import create_app
from tests.dashboards.synthetic import fill, regression

NOW = 1_800_000_000.0


def test_the_page_gets_a_handle_that_cannot_write(tmp_path):
    store = fill(tmp_path / "store", NOW, 600)
    store.save_regression(regression("server", NOW - 300))
    try:
        app = create_app({"STORE": store, "CHECK_HOST": False})
        page_store = app.config["STORE"]
        assert isinstance(page_store, ReadOnlyStore)
        with pytest.raises(StoreError, match="read-only"):
            page_store.save_regression(regression("server", NOW - 100))
        with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
            page_store.query("DELETE FROM windows")
        client = app.test_client()
        assert client.get("/api/targets").get_json()[0]["name"] == "server"
        assert [r["id"] for r in client.get("/api/regressions").get_json()] == ["server-1799999700"]
        # What the agent writes after the page opened is what the page reads next.
        store.save_regression(regression("server", NOW - 100))
        assert len(client.get("/api/regressions").get_json()) == 2
        assert store.windows(limit=1)  # the agent's own handle still writes and reads
    finally:
        store.close()
