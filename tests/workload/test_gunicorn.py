"""The workload pre-forked by gunicorn: a master and its workers, /metrics summed over them, a fault in one."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workload.netloss import table_name
from workload.wsgi import Settings, SettingsError

pytestmark = pytest.mark.workload

REPO = Path(__file__).resolve().parents[2]
TOKEN = "gunicorn-test-token"
BOOT_TIMEOUT_S = 240.0  # four workers importing torch at once on a loaded two-core host
REQUEST_TIMEOUT_S = 120.0
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")
READY = re.compile(r"workload: worker (\d+) serving")
COMPLETION = {"prompt": "hello", "max_tokens": 8, "temperature": 0}


@dataclass
class Gunicorn:
    proc: subprocess.Popen
    port: int
    metrics_dir: Path
    log: list[str] = field(default_factory=list)

    @property
    def master(self) -> int:
        return self.proc.pid

    def ready_pids(self) -> set[int]:
        return {int(m.group(1)) for line in list(self.log) for m in [READY.search(line)] if m}


def start_gunicorn(tmp: Path, *flags: str, **extra_env: str) -> Gunicorn:
    metrics_dir = tmp / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WORKLOAD_ADMIN_TOKEN": TOKEN, "WORKLOAD_TORCH_THREADS": "1", "WORKLOAD_MODEL": "tiny",
           "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PYTHONUNBUFFERED": "1", **extra_env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "python:workload.gunicorn_conf", "-b", "127.0.0.1:0",
         "--keep-alive", "60", *flags, "workload.wsgi:create()"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    server = Gunicorn(proc, 0, metrics_dir)
    threading.Thread(target=lambda: server.log.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return server


def await_workers(server: Gunicorn, n: int, deadline_s: float = BOOT_TIMEOUT_S) -> set[int]:
    """Waits until n live children of the master have said they serve; returns their pids."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"gunicorn exited {server.proc.returncode}: {''.join(server.log)[-2000:]}")
        if not server.port:
            found = [m for line in list(server.log) for m in [LISTENING.search(line)] if m]
            server.port = int(found[0].group(1)) if found else 0
        ready = server.ready_pids() & children(server.master)
        if server.port and len(ready) >= n and len(children(server.master)) == n:
            return ready
        time.sleep(0.5)
    pytest.fail(f"{n} workers not serving within {deadline_s} s: {''.join(server.log)[-2000:]}")


def stop_gunicorn(server: Gunicorn) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(60)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(10)


def children(pid: int) -> set[int]:
    """The master's children, from the kernel's own list (/proc/PID/task/*/children)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


def ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


class Pinned:
    """One kept-alive connection, hence one worker: gthread serves a connection's requests in the worker that
    accepted it. Every call that returns a pid checks it is still that worker."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
        self.pid = self.call("GET", "/health")["pid"]

    def raw(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        self.conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        response = self.conn.getresponse()
        text = response.read().decode()
        assert response.getheader("Connection", "").lower() != "close", f"{path}: the worker closed the connection"
        return response.status, text

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        status, text = self.raw(method, path, body)
        assert status == 200, f"{method} {path}: {status} {text}"
        payload = json.loads(text)
        if "pid" in payload and hasattr(self, "pid"):
            assert payload["pid"] == self.pid, "the connection moved to another worker"
        return payload

    def metrics(self) -> dict[str, float]:
        status, text = self.raw("GET", "/metrics")
        assert status == 200
        return samples(text)

    def close(self) -> None:
        self.conn.close()


def samples(text: str) -> dict[str, float]:
    """name{labels} -> value, labels sorted, for every sample of a scrape."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def scrape(port: int) -> dict[str, float]:
    return samples(scrape_text(port))


def complete(port: int) -> None:
    """One completion on a connection of its own (the worker may be recycled after it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", "/v1/completions", json.dumps(COMPLETION), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        assert json.loads(response.read())["usage"]["completion_tokens"] == 8
    finally:
        conn.close()


def successes(values: dict[str, float]) -> float:
    return sum(v for k, v in values.items() if k.startswith("vllm:request_success_total{"))


def pinned_to_distinct_workers(port: int, want: int, tries: int = 200) -> dict[int, Pinned]:
    """Opens connections until `want` different workers hold one (or tries run out); extra ones are closed."""
    held: dict[int, Pinned] = {}
    spare: list[Pinned] = []
    for _ in range(tries):
        conn = Pinned(port)
        if conn.pid in held:
            spare.append(conn)  # kept open, so that worker is busier and the next accept may go elsewhere
        else:
            held[conn.pid] = conn
        if len(held) >= want:
            break
    for conn in spare:
        conn.close()
    return held


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> Iterator[tuple[Gunicorn, set[int]]]:
    server = start_gunicorn(tmp_path_factory.mktemp("gunicorn"), "-w", "4")
    try:
        yield server, await_workers(server, 4)
    finally:
        stop_gunicorn(server)


def test_a_master_and_four_workers_are_separate_processes_that_serve(four):
    server, workers = four
    assert len(workers) == 4 and server.master not in workers
    assert all(ppid(pid) == server.master for pid in workers)
    conn = Pinned(server.port)
    try:
        assert conn.pid in workers
        reply = conn.call("POST", "/v1/completions", COMPLETION)
        assert reply["usage"]["completion_tokens"] == 8
    finally:
        conn.close()


def test_metrics_of_any_worker_count_every_request_once(four):
    server, workers = four
    before = successes(scrape(server.port))
    n, served_by = 0, set()
    # A fresh connection each, so the requests spread over the workers; on, until at least three have served.
    while n < 24 or (len(served_by) < 3 and n < 200):
        conn = Pinned(server.port)
        conn.call("POST", "/v1/completions", COMPLETION)
        served_by.add(conn.pid)
        conn.close()
        n += 1
    assert len(served_by) >= 2, "every request went to one worker: the sum over workers was not exercised"
    scraped_by: set[int] = set()
    for conn in pinned_to_distinct_workers(server.port, 4).values():
        assert successes(conn.metrics()) - before == n, f"worker {conn.pid}'s scrape"
        scraped_by.add(conn.pid)
        conn.close()
    assert len(scraped_by) >= 2


def test_metric_names_are_the_single_process_servers(four, server):
    """`server` is `python -m workload serve` (tests/workload/conftest.py); each has answered a completion."""
    gunicorn, _ = four
    complete(gunicorn.port)
    single_port = int(server.url.rsplit(":", 1)[1])
    complete(single_port)
    expected = {shape for shape in shapes(scrape_text(single_port)) if not shape[0].endswith("_created")}
    scraped = shapes(scrape_text(gunicorn.port))
    # A multiprocess scrape has no _created samples, and no pid label on the live-summed gauges.
    assert ("vllm:request_success_total", ("finished_reason", "model_name")) in expected
    assert ("workload_fault_active", ("fault",)) in expected
    assert expected - scraped == set()
    assert scraped - expected == set()


def scrape_text(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        return response.read().decode()
    finally:
        conn.close()


def shapes(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """(sample name, label names) of every sample: what a scrape config or a dashboard query depends on."""
    return {(s.name, tuple(sorted(s.labels))) for family in text_string_to_metric_families(text)
            for s in family.samples}


def test_a_gc_fault_lands_in_the_one_worker_its_response_names(four):
    server, workers = four
    pinned = pinned_to_distinct_workers(server.port, 4)
    assert len(pinned) >= 2, "could not reach two different workers"
    target, *others = pinned.values()
    try:
        reply = target.call("POST", "/admin/faults", {"name": "gc", "on": True})
        assert reply["gc"] is True and reply["pid"] == target.pid and target.pid in workers
        assert target.metrics()['workload_fault_active{fault=gc}'] == 1, "switched on in more than one worker"
        for other in others:
            assert other.call("GET", "/admin/faults")["gc"] is False
        # Ground truth: each worker's own collector counts (gc.get_stats) across the same requests.
        grown = {}
        for conn in pinned.values():
            first = conn.call("GET", "/admin/debug")["gc"]["collections"][0]
            for _ in range(3):
                conn.call("POST", "/v1/completions", COMPLETION)
            grown[conn.pid] = conn.call("GET", "/admin/debug")["gc"]["collections"][0] - first
        # 8 tokens x 4,000 cycles of 3 containers per completion: hundreds of young collections.
        assert grown[target.pid] >= 100, grown
        assert all(grown[o.pid] * 20 < grown[target.pid] for o in others), grown
    finally:
        off = target.call("POST", "/admin/faults", {"name": "gc", "on": False})
        for conn in pinned.values():
            conn.close()
    assert off["gc"] is False and off["pid"] == target.pid
    assert scrape(server.port)['workload_fault_active{fault=gc}'] == 0


def test_recycled_workers_keep_serving_and_the_counters_keep_counting(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # Without a metrics directory of ours: the master makes one in $TMPDIR and removes it on exit.
    server = start_gunicorn(tmp_path, "-w", "2", "--max-requests", "6", PROMETHEUS_MULTIPROC_DIR="",
                            TMPDIR=str(scratch))
    try:
        first = await_workers(server, 2)
        made = list(scratch.iterdir())
        assert len(made) == 1 and made[0].name.startswith("workload-metrics-")
        done, totals = 0, []
        for _ in range(5):
            for _ in range(6):
                complete(server.port)
                done += 1
            totals.append(successes(scrape(server.port)))
            assert totals[-1] == done, totals
        now = await_workers(server, 2)
        assert first - now, f"no worker was recycled: {first} then {now}"
        assert all(ppid(pid) == server.master for pid in now)
        idle = scrape(server.port)
        # The dead workers' gauges left the sum; their counters stayed in it.
        assert idle["vllm:num_requests_running{model_name=infersight-tiny}"] == 0
        assert successes(idle) == done
        assert list(made[0].glob("counter_*.db")), "the workers kept their values elsewhere"
    finally:
        stop_gunicorn(server)
    assert list(scratch.iterdir()) == []


def test_files_of_an_earlier_run_are_not_summed_in_and_nothing_else_is_removed(tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_4242.db").write_bytes(b"left by a run that crashed")
    (metrics_dir / "notes.txt").write_text("not prometheus_client's")
    server = start_gunicorn(tmp_path, "-w", "1")
    try:
        await_workers(server, 1)
        complete(server.port)
        assert successes(scrape(server.port)) == 1
        assert not (metrics_dir / "counter_4242.db").exists()
        assert (metrics_dir / "notes.txt").read_text() == "not prometheus_client's"
    finally:
        stop_gunicorn(server)


@pytest.mark.root
def test_a_worker_switches_its_faults_off_as_it_exits(tmp_path, require_root):
    """The netloss fault's nftables table is named by the port gunicorn bound (post_fork hands it to the worker)
    and outlives a worker that exits without switching it off: worker_exit must drop it."""
    server = start_gunicorn(tmp_path, "-w", "1")
    try:
        await_workers(server, 1)
        conn = Pinned(server.port)
        assert conn.call("POST", "/admin/faults", {"name": "netloss", "on": True})["netloss"] is True
        conn.close()
        listed = subprocess.run(["nft", "list", "table", "inet", table_name(server.port)], capture_output=True,
                                text=True, check=False)
        assert listed.returncode == 0 and f"dport {server.port}" in listed.stdout
    finally:
        stop_gunicorn(server)
    assert server.proc.returncode == 0
    gone = subprocess.run(["nft", "list", "table", "inet", table_name(server.port)], capture_output=True, text=True,
                          check=False)
    if gone.returncode == 0:
        subprocess.run(["nft", "delete", "table", "inet", table_name(server.port)], check=False)
    assert gone.returncode != 0, "the netloss table outlived the worker"


@pytest.mark.parametrize(("env", "line"), [
    ({"WORKLOAD_MAX_BATCH": "zero"}, "workload: WORKLOAD_MAX_BATCH must be a positive int, got 'zero'"),
    ({"WORKLOAD_MODEL": "huge"}, "workload: WORKLOAD_MODEL: unknown model preset 'huge'"),
    ({"WORKLOAD_ADMIN_TOKEN_FILE": "/nonexistent/token"}, "workload: WORKLOAD_ADMIN_TOKEN_FILE: cannot read token"),
])
def test_a_bad_setting_stops_the_master_with_one_line_before_any_worker(tmp_path, env, line):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # No metrics directory given: the master makes one in $TMPDIR, and must not leave it behind.
    server = start_gunicorn(tmp_path, "-w", "2", PROMETHEUS_MULTIPROC_DIR="", TMPDIR=str(scratch), **env)
    assert server.proc.wait(BOOT_TIMEOUT_S) != 0
    time.sleep(0.5)  # the reader thread drains the pipe
    said = "".join(server.log)
    assert line in said
    assert "Booting worker" not in said and "Traceback" not in said
    assert list(scratch.iterdir()) == []


def test_settings_from_the_environment():
    assert Settings.from_env({}) == Settings()
    got = Settings.from_env({"WORKLOAD_MAX_BATCH": "4", "WORKLOAD_BATCH_WINDOW_MS": "2.5", "WORKLOAD_PORT": "8123",
                             "WORKLOAD_ADMIN_TOKEN_FILE": "/etc/token"})
    assert (got.max_batch, got.batch_window_ms, got.port, str(got.admin_token_file)) == (4, 2.5, 8123, "/etc/token")
    for name, raw in [("WORKLOAD_MAX_BATCH", "-1"), ("WORKLOAD_MAX_BATCH", "2.5"), ("WORKLOAD_TORCH_THREADS", "0"),
                      ("WORKLOAD_BATCH_WINDOW_MS", "nan"), ("WORKLOAD_BATCH_WINDOW_MS", "inf"),
                      ("WORKLOAD_DEVICE", "tpu")]:
        with pytest.raises(SettingsError, match=f"{name}.*{raw!r}"):
            Settings.from_env({name: raw})
