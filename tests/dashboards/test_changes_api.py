"""/api/changes and the target page's change list over a real store (hostile text stays text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.store import Store, StoredChange
from dashboards.app import create_app

HOSTILE = '<script>alert(1)</script>"onerror="x'


def _change(at: float, target: str = "server") -> StoredChange:
    return StoredChange(id=f"{target}-change-{at:.3f}", target=target, at=at, pid=4242,
                        before={"env": {"OMP_NUM_THREADS": "4"}}, after={"env": {"OMP_NUM_THREADS": "1"}},
                        diff=[{"part": "env", "before": "OMP_NUM_THREADS=4", "after": "OMP_NUM_THREADS=1"},
                              {"part": "dists", "before": f"{HOSTILE}=1", "after": f"{HOSTILE}=2"}])


@pytest.fixture
def client(tmp_path: Path):
    with Store.open(tmp_path / "store") as store:
        for at, target in ((1000.0, "server"), (2000.0, "server"), (1500.0, "other")):
            store.settle_identity(target, 4242, 1, at, {"env": {}}, _change(at, target))
        yield create_app({"STATE": None, "STORE": store, "TESTING": True}).test_client()


def test_lists_changes_newest_first_with_filters(client):
    body = client.get("/api/changes").get_json()
    assert [c["at"] for c in body["changes"]] == [2000.0, 1500.0, 1000.0]
    only = client.get("/api/changes?target=server&since=1200").get_json()["changes"]
    assert [c["id"] for c in only] == ["server-change-2000.000"]
    assert only[0]["diff"][0] == {"part": "env", "before": "OMP_NUM_THREADS=4", "after": "OMP_NUM_THREADS=1"}
    assert only[0]["diff"][1]["after"] == f"{HOSTILE}=2"  # JSON; the page makes it a text node
    one = client.get("/api/changes/server-change-1000.000").get_json()
    assert one["before"] == {"env": {"OMP_NUM_THREADS": "4"}}


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "limit=abc", "since=nan", "until=x"])
def test_bad_arguments_are_400_with_a_reason(client, query):
    resp = client.get(f"/api/changes?{query}")
    assert resp.status_code == 400 and resp.get_json()["error"]


def test_unknown_change_is_404(client):
    resp = client.get("/api/changes/" + "x" * 300)
    assert resp.status_code == 404 and len(resp.get_json()["error"]) < 200


def test_target_page_has_the_change_list(client):
    page = client.get("/targets/server").get_data(as_text=True)
    assert 'id="target-changes"' in page


def test_report_of_a_slower_build_over_stored_windows(tmp_path: Path, capsys):
    import dataclasses

    from agent.cli import main
    from tests.analysis.test_change_report import _windows

    with Store.open(tmp_path / "store") as store:
        for w in _windows(40, 1000.0, latency=0.05):
            store.add_window(w)
        for w in _windows(40, 1210.0, latency=0.09, seed=1):
            store.add_window(dataclasses.replace(w, pid=2))
        change = StoredChange(id="srv-change-1205.000", target="srv", at=1205.0, pid=2, before={}, after={},
                              diff=[{"part": "cmdline", "before": "serve --max-batch 8", "after": HOSTILE}])
        store.settle_identity("srv", 2, 1, 1205.0, {}, change)
        client = create_app({"STATE": None, "STORE": store, "TESTING": True}).test_client()
        body = client.get("/api/changes/srv-change-1205.000/report").get_json()
        assert body["verdict"] == "regression"
        p99 = next(r for r in body["rows"] if r["figure"] == "p99_at_equal_load")
        assert p99["verdict"] == "regression" and 1.6 < p99["ratio"] < 2.0
        assert client.get("/api/changes/nosuch/report").status_code == 404
    html = tmp_path / "report.html"
    assert main(["changes", "--store", str(tmp_path / "store"), "--report", "srv-change-1205.000",
                 "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "p99_at_equal_load" in out and "verdict: regression" in out
    page = html.read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert main(["changes", "--store", str(tmp_path / "store"), "--html", str(html)]) != 0
    assert main(["changes", "--store", str(tmp_path / "store"), "--report", "nosuch"]) != 0
