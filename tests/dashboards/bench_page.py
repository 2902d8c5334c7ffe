"""Page benchmarks: a bounded loopback load on the page, the JSON API and /metrics while the real agent collects,
and the time a 7-day chart takes from a store holding a synthetic week. Results in docs/BENCHMARKS.md.

    python -m tests.dashboards.bench_page load --rate 50 --duration 60      (root: starts workload + agent)
    python -m tests.dashboards.bench_page week --store /tmp/week            (fills it once, then reuses it)
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.live import free_port, wait_http, workload_target, write_agent_config

LOAD_PATHS = ("/", "/api/overview", "/api/status", "/api/series?target=workload&range=1h", "/metrics")


@dataclass
class Result:
    path: str
    latencies: list[float] = field(default_factory=list)
    # From the moment the request was sent: the server's share, without the load generator's own lateness.
    service: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        ms = sorted(x * 1000 for x in self.latencies)
        sv = sorted(x * 1000 for x in self.service)
        return {"path": self.path, "requests": len(ms), "errors": len(self.errors), "first_errors": self.errors[:3],
                "p50_ms": round(_q(ms, 0.5), 1), "p99_ms": round(_q(ms, 0.99), 1), "max_ms": round(ms[-1], 1),
                "mean_ms": round(statistics.fmean(ms), 1),
                "service_p50_ms": round(_q(sv, 0.5), 1), "service_p99_ms": round(_q(sv, 0.99), 1)}


def _q(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, math.ceil(q * len(sorted_ms)) - 1)]


def drive(host: str, port: int, rate: float, duration: float, paths: tuple[str, ...] = LOAD_PATHS) -> dict:
    """Open loop: request i is due at start + i/rate whatever the answers before it took (no coordinated omission:
    latency counts from the due time)."""
    results = {p: Result(p) for p in paths}
    slow_at: list[float] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.5
    n = int(rate * duration)

    def one(i: int) -> None:
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        path = paths[i % len(paths)]
        sent = time.monotonic()
        try:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            conn.request("GET", path, headers={"Accept": "application/json" if "/api/" in path else "*/*"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            ok, why = resp.status == 200, f"HTTP {resp.status}"
        except OSError as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        done = time.monotonic()
        with lock:
            if ok:
                if done - due > 0.05:
                    slow_at.append(round(due - start, 2))
                results[path].latencies.append(done - due)
                results[path].service.append(done - sent)
            else:
                results[path].errors.append(why)

    with ThreadPoolExecutor(max_workers=64) as pool:
        list(pool.map(one, range(n)))
    every = Result("all")
    for r in results.values():
        every.latencies += r.latencies
        every.service += r.service
        every.errors += r.errors
    return {"rate": rate, "duration": duration, "all": every.summary(), "over_50ms_at_s": sorted(slow_at),
            "by_path": [r.summary() for r in results.values()]}


def run_load(rate: float, duration: float, settle: float, workdir: Path) -> dict:
    """The bundled workload under 3 req/s, the real agent watching it (5 s windows), then the page load."""
    port, agent_port = free_port(), free_port()
    tag = f"bench-{uuid.uuid4().hex[:10]}"
    # The agent's default interval (5 s): the load a person's browser adds to an agent running as shipped.
    config = write_agent_config(workdir, agent_port, workload_target(tag, port, timeout_seconds=10), interval=5)
    workdir.chmod(0o700)
    log = open(workdir / "processes.log", "w")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port),
                                       "--admin-token", tag], stdout=log, stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{port}/health", 120)
        procs.append(subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", f"http://127.0.0.1:{port}",
                                       "--rate", "3", "--duration", str(int(settle + duration + 30)),
                                       "--no-progress"], stdout=log, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                      stdout=log, stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{agent_port}/api/status", 60)
        wait_http(f"http://127.0.0.1:{agent_port}/api/series?target=workload&range=15m", 120)
        time.sleep(settle)  # more windows in the store, so the hour-range series has data in it
        result = drive("127.0.0.1", agent_port, rate, duration)
        conn = http.client.HTTPConnection("127.0.0.1", agent_port, timeout=10)
        conn.request("GET", "/api/status")
        status = json.loads(conn.getresponse().read())
        conn.close()
        result["agent"] = {k: status[k] for k in ("windows_written", "late_ticks", "dropped_windows")}
        return result
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def run_week(store_dir: Path, browser: bool = True) -> dict:
    """Fill (once) a store with 7 days of 5 s windows, then time the 7-day series: the first request on a store
    with no minute rollup yet, then (once the agent rolled the week up) the first after a restart (a new store
    handle and app: the rollup is on disk),
    warm requests, and the page in Chromium."""
    from agent.state import AgentState, TargetStatus
    from agent.store import Store
    from agent.store.rollup import Rollup
    from dashboards.app import create_app
    from tests.dashboards.browser import chromium, serve, wait_for
    from tests.dashboards.synthetic import fill

    out: dict = {}
    now = time.time()
    if not (store_dir / "infersight.db").exists():
        t0 = time.monotonic()
        fill(store_dir, now, 7 * 86400, slow_from=now - 3600).close()
        out["fill_seconds"] = round(time.monotonic() - t0, 1)

    def started() -> tuple[Store, object, str]:
        store = Store.open(store_dir)
        (target,) = store.targets()
        state = AgentState()
        state.set_target(TargetStatus(name="server", pid=4242, state="watching", since=target.first_start))
        end = target.last_end + 1
        query = f"/api/series?target=server&from={end - 7 * 86400}&to={end}&points=600"
        return store, create_app({"STATE": state, "STORE": store, "INTERVAL_SECONDS": 5.0}), query

    def timed(url: str, query: str) -> float:
        host, port = url.removeprefix("http://").split(":")
        t0 = time.monotonic()
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.request("GET", query)
        body = conn.getresponse().read()
        conn.close()
        assert len(json.loads(body)["t"]) > 500
        return time.monotonic() - t0

    store, app, query = started()
    (target,) = store.targets()
    out["windows"] = target.windows
    out["span_days"] = round((target.last_end - target.first_start) / 86400, 2)
    out["rolled_up_before"] = store.rollup_progress("server") is not None
    with serve(app) as url:
        # On a store never rolled up (an agent that has just started), a request reads every window of the week.
        out["first_api_seconds"] = round(timed(url, query), 3)
    # The agent's housekeeping rolls the week up; the page only reads the minutes.
    t0 = time.monotonic()
    Rollup(store).warm(["server"])
    out["rollup_seconds"] = round(time.monotonic() - t0, 1)
    store.close()
    store, app, query = started()
    with serve(app) as url:
        # The agent restarted: the minutes are on disk, only those since the last roll are read from windows.
        out["after_restart_api_seconds"] = round(timed(url, query), 3)
        out["warm_api_seconds"] = sorted(round(timed(url, query), 3) for _ in range(5))
        if browser:
            with tempfile.TemporaryDirectory() as tmp, chromium(Path(tmp)) as b:
                renders = []
                for _ in range(3):
                    b.get(f"{url}/targets/server?range=7d")
                    wait_for(b, "return document.getElementById('target').dataset.loaded === '7d'", timeout=60)
                    renders.append(int(b.execute_script("return document.getElementById('target').dataset.renderMs")))
                    points = b.execute_script("return window.infersightCharts[0].data[0].length")
                out["browser_render_ms"] = renders
                out["browser_points"] = points
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    load = sub.add_parser("load")
    load.add_argument("--rate", type=float, default=50.0)
    load.add_argument("--duration", type=float, default=60.0)
    load.add_argument("--settle", type=float, default=15.0)
    load.add_argument("--nice", type=int, default=0,
                      help="niceness increment for this run and its children (negative needs root): on a shared "
                           "host, separates the agent's own latency from other tenants' CPU")
    week = sub.add_parser("week")
    week.add_argument("--store", type=Path, required=True)
    week.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    if args.cmd == "load":
        if args.nice:
            os.nice(args.nice)
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_load(args.rate, args.duration, args.settle, Path(tmp)), indent=1))
    else:
        print(json.dumps(run_week(args.store, browser=not args.no_browser), indent=1))


if __name__ == "__main__":
    main()
