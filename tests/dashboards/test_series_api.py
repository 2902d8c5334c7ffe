"""/api/overview, /api/series, /api/flamegraph/tree, the new pages' JSON helpers and the security headers."""

from __future__ import annotations

import math
import sqlite3
import time

import pytest

from agent.detection import DetectionSnapshot, TargetFinding
from agent.state import AgentState
from agent.store.rollup import Rollup
from analysis.health import Health
from analysis.snapshot import TargetStatus
from dashboards.app import create_app
from dashboards.security import CSP
from dashboards.series import FIELDS, FIELDS_KEY, MINUTE, SETTLE_SECONDS, Bucket, minute_buckets
from tests.dashboards.synthetic import HOSTILE_FRAME, fill, regression

NOW = time.time()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # "Now" is when the store is filled, not when the module was imported: a long suite collects this module
    # many minutes before it runs it, and the API's "last hour" counts from the real clock.
    global NOW
    NOW = time.time()
    s = fill(tmp_path_factory.mktemp("series") / "store", NOW, 3600, slow_from=NOW - 600)
    s.save_regression(regression("server", NOW - 540))
    yield s
    s.close()


@pytest.fixture
def client(store):
    state = AgentState()
    state.set_target(TargetStatus(name="server", pid=4242, state="watching", since=NOW - 3600))
    state.set_health("syscalls", Health(name="syscalls", state="running"))
    state.record_window(store.latest("server"))
    snap = DetectionSnapshot(findings={"server": TargetFinding("server", "regression", 9.0, {"p50": 0.05, "p99": 0.12},
                                                               store.regressions()[0], NOW)})
    return create_app({"STATE": state, "STORE": store, "FINDINGS": lambda: snap, "INTERVAL_SECONDS": 5.0}).test_client()


def test_series_downsamples_and_shows_the_slowdown(client):
    data = client.get("/api/series?target=server&range=1h&points=60").get_json()
    assert len(data["t"]) <= 61 and data["step"] == 60
    p50 = data["series"]["p50_ms"]
    assert 49 < p50[0] < 56 and 89 < p50[-2] < 96, p50  # 50 ms, then 90 ms in the last ten minutes
    assert data["series"]["cpu_cores"][0] == pytest.approx(0.7, abs=0.1)
    assert data["expected_ms"] == {"p50": 50.0, "p99": 120.0}
    assert [r["top_cause"] for r in data["regressions"]] == ["gc"]
    assert set(data["series"]) == set(data["units"])


def test_unmeasured_fields_are_null_not_zero(client, store):
    data = client.get(f"/api/series?target=server&from={NOW - 7200}&to={NOW - 3700}").get_json()
    assert data["t"] == [] or all(v is None for v in data["series"]["p99_ms"])


def _as_tuples(buckets):
    return [(b.start, b.windows, round(b.seconds, 6), {k: round(v, 9) for k, v in b.sums.items()}, b.counts,
             b.maxes) for b in buckets]


def test_minute_rollup_gives_the_same_answer_as_the_store(tmp_path):
    s = fill(tmp_path / "store", NOW, 3600, slow_from=NOW - 600)
    try:
        direct = [Bucket.of(a) for a in s.aggregate("server", NOW - 3600, NOW + 60, MINUTE, FIELDS)]
        # The agent rolls up; the page reads (asked directly here: it serves ranges above 3 h).
        Rollup(s, clock=lambda: NOW).advance("server")
        minutes = minute_buckets(s, "server", NOW - 3600, NOW + 60)
        assert _as_tuples(minutes) == _as_tuples(direct)
        done, fields = s.rollup_progress("server")
        assert fields == FIELDS_KEY and done <= NOW - SETTLE_SECONDS < done + MINUTE
        # Every final minute with a window is on disk; the unsettled tail is read fresh and not stored.
        stored = s.rollup_minutes("server", 0, NOW + 60)
        assert [m["start"] for m in stored] == [b.start for b in minutes if b.start < done]
        assert minutes[-1].start >= done
        Rollup(s, clock=lambda: NOW).advance("server")
        again = minute_buckets(s, "server", NOW - 3600, NOW + 60)
        assert _as_tuples(again) == _as_tuples(minutes)
    finally:
        s.close()


def test_a_restarted_page_reads_the_stored_minutes_not_the_windows(tmp_path):
    s = fill(tmp_path / "store", NOW, 3600)
    Rollup(s, clock=lambda: NOW).advance("server")
    first = s.rollup_minutes("server", 0, NOW)
    # Remove the windows the rollup covers: a new Rollup (the agent restarted) must still answer from the minutes.
    done, _ = s.rollup_progress("server")
    with s.transaction() as conn:
        conn.execute("DELETE FROM profiles")
        conn.execute("DELETE FROM windows WHERE start < ?", (done,))
    again = minute_buckets(s, "server", NOW - 3600, done)
    assert len(again) == len(first) > 50 and sum(b.windows for b in again) == sum(m["windows"] for m in first)
    s.close()


def test_rollup_of_another_field_set_is_rebuilt_and_old_minutes_are_dropped(tmp_path):
    s = fill(tmp_path / "store", NOW, 3600)
    s.save_rollup("server", [{"start": 60.0, "windows": 1, "seconds": 5.0, "sums": {"p50": 9.0},
                              "counts": {"p50": 1}, "maxes": {"p50": 9.0}}], NOW, '{"p50":"$.old"}', 0.0)
    Rollup(s, clock=lambda: NOW).advance("server")
    minutes = minute_buckets(s, "server", NOW - 3600, NOW)
    assert s.rollup_progress("server")[1] == FIELDS_KEY
    assert s.rollup_minutes("server", 0, 120) == []  # the stale minute went with its field set
    assert sum(b.windows for b in minutes) == len(s.windows("server", since=NOW - 3600, until=NOW,
                                                            with_profiles=False)) - _straddling(s)
    s.close()


def _straddling(s) -> int:
    """Windows that overlap the range but start before it (the rollup groups windows by start)."""
    return sum(1 for w in s.windows("server", since=NOW - 3600, until=NOW, with_profiles=False)
               if w.start < math.floor((NOW - 3600) / MINUTE) * MINUTE)


def test_a_store_that_cannot_be_written_still_answers_from_the_windows(tmp_path):
    s = fill(tmp_path / "store", NOW, 3600)

    def refuse(*args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    s.save_rollup = refuse
    rollup = Rollup(s, clock=lambda: NOW)
    rollup.advance("server")
    minutes = minute_buckets(s, "server", NOW - 3600, NOW + 60)
    direct = [Bucket.of(a) for a in s.aggregate("server", NOW - 3600, NOW + 60, MINUTE, FIELDS)]
    assert _as_tuples(minutes) == _as_tuples(direct) and "readonly" in rollup.warm_error
    assert s.rollup_progress("server") is None
    s.close()


def test_overview_has_state_band_and_sparkline(client):
    data = client.get("/api/overview").get_json()
    (t,) = data["targets"]
    assert t["status"] == "regression open" and t["expected_ms"]["p99"] == 120.0
    assert len(t["sparkline"]["t"]) >= 50 and t["sparkline"]["p99_ms"][-1] > 150
    assert data["regressions"][0]["target"] == "server"


def test_flame_tree_and_its_diff(client):
    tree = client.get(f"/api/flamegraph/tree?target=server&from={NOW - 600}").get_json()
    assert tree["total"] > 0 and tree["tree"]["name"] == "all"
    serve = tree["tree"]["children"][0]
    assert serve["name"] == "serve (server.py:10)"
    assert HOSTILE_FRAME in [c["name"] for c in serve["children"]]  # JSON carries it as data; the page makes it text
    diff = client.get(f"/api/flamegraph/tree?target=server&from={NOW - 540}&baseline_from={NOW - 3600}"
                      f"&baseline_to={NOW - 700}").get_json()
    step = {c["name"]: c for c in diff["tree"]["children"][0]["children"]}["step (engine.py:40)"]
    kids = {c["name"]: c["delta"] for c in step["children"]}
    assert kids["decode (model.py:88)"] > 0 > kids["tokenize (tok.py:12)"]


@pytest.mark.parametrize("query, code, says", [
    ("/api/series?target=nobody", 404, "nobody"),
    ("/api/series?target=server&range=2y", 400, "range must be one of"),
    ("/api/series?target=server&points=5", 400, "points must be an integer"),
    ("/api/series?target=server&from=10&to=5", 400, "from must be before to"),
    ("/api/series?target=server&from=nan", 400, "finite"),
    ("/api/series?target=server&from=0&to=9999999", 400, "at most 8 days"),
    ("/api/flamegraph/tree?target=server&kind=x", 400, "kind must be one of"),
    ("/api/flamegraph/tree?target=server&from=zz", 400, "'zz'"),
    ("/api/regressions/nope", 404, "no regression with id 'nope'"),
])
def test_bad_input_gets_one_clear_line(client, query, code, says):
    resp = client.get(query)
    assert resp.status_code == code and says in resp.get_json()["error"]


def test_every_page_has_a_strict_csp(client, store):
    rid = store.regressions()[0].id
    for path in ("/", "/targets/server", "/regressions", f"/regressions/{rid}", "/flamegraph", "/api/overview"):
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert resp.headers["Content-Security-Policy"] == CSP and "'unsafe-inline'" not in CSP
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        if resp.mimetype == "text/html":
            html = resp.get_data(as_text=True)
            assert "<script>" not in html and "style=" not in html and "http://" not in html.split("</header>")[1], path
    svg = client.get("/api/flamegraph?target=server&format=svg")
    assert svg.headers["Content-Security-Policy"].startswith("sandbox allow-scripts")


def test_target_name_in_the_page_is_escaped(client):
    html = client.get('/targets/%3Cimg%20src=x%20onerror=%22alert(1)%22%3E').get_data(as_text=True)
    assert "<img" not in html and "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html


def test_alerts_api_says_when_delivery_is_not_configured(client):
    r = client.get("/api/alerts")
    assert r.status_code == 503 and r.get_json() == {"error": "this agent delivers no alerts"}


def test_offcpu_by_wait_kind(client):
    data = client.get("/api/offcpu?target=server&range=1h&points=12").get_json()
    assert list(data["kinds"]) == ["futex"] and data["labels"] == {"futex": "lock (futex)"} and len(data["t"]) == 12
    # 800 us of futex wait per 5 s window: 160 us per second.
    assert data["kinds"]["futex"][3] == pytest.approx(0.00016, rel=0.05)
    resp = client.get("/api/offcpu?target=server&range=7d")
    assert resp.status_code == 400 and "at most 24 hours" in resp.get_json()["error"]


@pytest.mark.parametrize("path, arg", [
    ("/api/windows?", "since"), ("/api/series?target=server&", "to"), ("/api/flamegraph/tree?target=server&", "from"),
    ("/api/flamegraph?target=server&", "from"), ("/api/flamegraph/diff?target=server&", "baseline_to"),
])
@pytest.mark.parametrize("raw", ["inf", "nan", "abc"])
def test_every_time_argument_is_refused_the_same_way(client, path, arg, raw):
    resp = client.get(f"{path}{arg}={raw}")
    assert resp.status_code == 400
    assert resp.get_json()["error"] == f"{arg} must be a finite number of unix seconds, got {raw!r}"


def test_offcpu_kinds_are_the_detectors_a_stopped_server_is_stopped_not_preempted(store, client):
    """The page charted a SIGSTOPped server's do_signal_stop stacks as preempted while the detector called it
    blocked: one classifier now (analysis.waits)."""
    from analysis.window import OffCpuReading, Window

    stopped = "entry_SYSCALL_64;exit_to_user_mode_loop;get_signal;do_signal_stop;schedule"
    base = NOW - 600
    for i in range(3):
        store.add_window(Window(target="stopper", pid=9, start=base + 5 * i, end=base + 5 * i + 5,
                                offcpu=OffCpuReading(seconds=1.5, stacks={stopped: 1_500_000})))
    data = client.get("/api/offcpu?target=stopper&range=1h&points=12").get_json()
    assert list(data["kinds"]) == ["stopped"], data["kinds"]
    assert data["labels"]["stopped"].startswith("stopped")


def test_the_page_reads_long_ranges_without_rolling_up(client, store):
    # Over DIRECT_MAX_SECONDS the page reads the minute rollup; only the agent (agent.store.rollup) writes it.
    data = client.get("/api/series?target=server&range=7d&points=600").get_json()
    assert sum(data["windows"]) == len(store.windows("server", with_profiles=False))
    assert store.rollup_progress("server") is None


def test_a_host_without_a_gpu_is_not_a_failing_source():
    """A CPU-only host's GPU source is "absent": a fact about the host, so the target stays healthy; a GPU NVML
    cannot read is a failure."""
    from dashboards.series_api import target_state

    t = {"name": "server", "state": "watching"}
    absent = [{"source": "gpu:server", "state": "absent", "reason": "no GPU on this host"},
              {"source": "syscalls", "state": "running"}]
    assert target_state(t, {"errors": {}}, set(), absent, {"server": "healthy"}) == "healthy"
    broken = [{"source": "gpu:server", "state": "failed", "reason": "cannot read the GPU (/dev/nvidia0): ..."}]
    assert target_state(t, {"errors": {}}, set(), broken, {"server": "healthy"}) == "source failing"
