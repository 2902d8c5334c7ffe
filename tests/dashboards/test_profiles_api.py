"""Flame graph exports and the pprof pull endpoint over a real store."""

import gzip
import json
import os
import shutil
import subprocess

import pytest

from agent.store import Store
from analysis.window import OffCpuReading, StackReading, Window
from dashboards.app import create_app

HOSTILE = "<script>alert(1)</script>"


def window(start, active, idle=None, offcpu=None, target="server"):
    return Window(target=target, pid=100, start=start, end=start + 5,
                  stacks=StackReading(active=active, idle=idle or {}, rate_hz=49.0),
                  offcpu=OffCpuReading(seconds=1.0, stacks=offcpu or {}))


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "store")
    # Baseline: 0..100 s, steady; regression: 100..200 s, decode grows.
    for t in range(0, 100, 5):
        s.add_window(window(t, {"main;serve;decode": 10, "main;serve;tokenize": 10},
                            idle={"main;wait;futex": 7}, offcpu={"schedule;futex_wait": 500}))
    for t in range(100, 200, 5):
        s.add_window(window(t, {"main;serve;decode": 30, "main;serve;tokenize": 10, f"main;{HOSTILE}": 1}))
    yield s
    s.close()


@pytest.fixture
def client(store):
    clock = {"now": 1000.0}
    app = create_app({"STORE": store, "STACKS_RATE_HZ": 49, "INTERVAL_SECONDS": 5.0,
                      "SLEEP": lambda s: clock.__setitem__("now", clock["now"] + s), "CLOCK": lambda: clock["now"]})
    return app.test_client()


def test_folded_export_sums_the_range(client):
    text = client.get("/api/flamegraph?target=server&format=folded&from=0&to=100").get_data(as_text=True)
    lines = dict(line.rsplit(" ", 1) for line in text.strip().splitlines())
    assert lines == {"main;serve;decode": "200", "main;serve;tokenize": "200"}


def test_kinds_are_kept_apart(client):
    idle = client.get("/api/flamegraph?target=server&format=folded&kind=idle").get_data(as_text=True)
    off = client.get("/api/flamegraph?target=server&format=folded&kind=offcpu").get_data(as_text=True)
    assert idle.strip() == "main;wait;futex 140"
    assert off.strip() == "schedule;futex_wait 10000"


def test_svg_escapes_frame_names_from_the_target(client):
    resp = client.get("/api/flamegraph?target=server&format=svg&from=100")
    svg = resp.get_data(as_text=True)
    assert resp.mimetype == "image/svg+xml" and resp.headers["X-Content-Type-Options"] == "nosniff"
    assert HOSTILE not in svg and "&lt;script&gt;alert(1)&lt;/script&gt;" in svg


def test_speedscope_and_pprof(client):
    doc = json.loads(client.get("/api/flamegraph?target=server&format=speedscope").get_data())
    assert doc["$schema"].startswith("https://www.speedscope.app/")
    resp = client.get("/api/flamegraph?target=server&format=pprof")
    assert resp.mimetype == "application/octet-stream" and "attachment" in resp.headers["Content-Disposition"]
    assert gzip.decompress(resp.get_data())  # a valid gzip stream; decoded in the pprof tests


def test_diff_names_the_function_that_grew(client):
    movers = client.get("/api/flamegraph/diff?target=server&format=json&baseline_from=0&baseline_to=100"
                        "&from=100&to=200").get_json()
    by_name = {m["function"]: m for m in movers["movers"]}
    assert by_name["decode"]["self_delta_pp"] > 20  # 50% -> 73% of samples
    assert by_name["tokenize"]["self_delta_pp"] < -20  # 50% -> 24%
    assert movers["baseline_samples"] == 400 and movers["current_samples"] == 820
    svg = client.get("/api/flamegraph/diff?target=server&baseline_from=0&baseline_to=100&from=100&to=200")
    assert svg.mimetype == "image/svg+xml" and b"decode" in svg.get_data()


def test_pprof_pull_endpoint_waits_then_answers(store, tmp_path):
    clock = {"now": 150.0}
    app = create_app({"STORE": store, "STACKS_RATE_HZ": 49, "INTERVAL_SECONDS": 5.0, "CLOCK": lambda: clock["now"],
                      "SLEEP": lambda s: clock.__setitem__("now", clock["now"] + s)})
    resp = app.test_client().get("/debug/pprof/profile?seconds=20&target=server")
    assert resp.status_code == 200
    assert clock["now"] >= 170.0, "the endpoint blocks for the requested seconds, like Go's"
    path = tmp_path / "p.pb.gz"
    path.write_bytes(resp.get_data())
    go = shutil.which("go")
    if go is None:
        pytest.fail("go is missing: 'make setup' installs golang-go for `go tool pprof`")
    env = {**os.environ, "HOME": str(tmp_path), "GOCACHE": str(tmp_path / "gocache"), "GOFLAGS": ""}
    top = subprocess.run([go, "tool", "pprof", "-top", "-sample_index=samples", str(path)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert top.returncode == 0, top.stderr
    # Windows 150..170 s: four windows of 30 decode + 10 tokenize + 1 hostile = 164 samples.
    assert "of 164 total" in top.stdout and "decode" in top.stdout


@pytest.mark.parametrize("query, code, says", [
    ("/api/flamegraph?target=server&kind=bogus", 400, "kind"),
    ("/api/flamegraph?target=server&format=png", 400, "format"),
    ("/api/flamegraph?target=nobody", 404, "nobody"),
    ("/api/flamegraph?target=server&from=abc", 400, "'abc'"),
    ("/api/flamegraph?target=server&from=200&to=100", 400, "empty"),
    ("/debug/pprof/profile?seconds=0&target=server", 400, "seconds"),
    ("/debug/pprof/profile?seconds=x&target=server", 400, "seconds"),
    ("/api/flamegraph/diff?target=server&baseline_from=500&baseline_to=600", 404, "baseline"),
])
def test_bad_requests_get_a_clear_4xx(client, query, code, says):
    resp = client.get(query)
    assert resp.status_code == code
    assert says in resp.get_json()["error"]
