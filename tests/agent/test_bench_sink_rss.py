"""The sink's RSS benchmark runs the daemon's store-and-detector path over a recording and reports its growth."""

from __future__ import annotations

from pathlib import Path

from tests.agent import bench_sink_rss as sink_rss

STEADY = Path(__file__).parents[1] / "scenarios" / "recorded-neighbours" / "steady.jsonl.gz"


def test_sink_rss_reports_growth_past_the_detectors_first_fit(capsys) -> None:
    assert sink_rss.main([str(STEADY), "--windows", "40", "--from-window", "30", "--sqlite-cache-kib", "64"]) == 0
    out = capsys.readouterr().out
    assert "windows 40" in out and "growth" in out and "SQLite cache 64 KiB" in out



def test_a_start_past_the_last_window_is_an_error_not_a_figure(capsys) -> None:
    assert sink_rss.main([str(STEADY), "--windows", "5", "--from-window", "10"]) == 2
    assert "not below" in capsys.readouterr().err


def test_the_small_cache_is_undone_after_the_run() -> None:
    import agent.store.db as db
    before = db.connect, db.connect_read_only
    assert sink_rss.main([str(STEADY), "--windows", "3", "--from-window", "1", "--sqlite-cache-kib", "64"]) == 0
    assert (db.connect, db.connect_read_only) == before
