"""`infersight loadtest` against the real bundled server: bad input as one line, a queue-bound knee, probes."""

import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from agent.loadtest.client import Shape
from agent.loadtest.runner import Options, Runner
from agent.loadtest.schedule import parse_schedule
from agent.loadtest.sweep import start_server
from analysis.capacity import Slo

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.workload, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_queue():
    """One decode slot and a waiting queue of two: a burst meets the queue bound (429) at once."""
    server = start_server(["--threads", "1", "--max-batch", "1", "--max-waiting", "2"])
    yield server
    server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "loadtest", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def _loadtest_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("loadtest")]


@pytest.mark.parametrize("case", ["unreachable", "not the server", "no such pid", "schedule", "slo zero"])
def test_bad_input_is_one_clear_line_and_leaves_nothing_running(small_queue, case):
    url, pid = small_queue.url, str(small_queue.pid)
    args, code, expected = {
        "unreachable": ([f"--url=http://127.0.0.1:{_free_port()}", "--pid", pid], 1, "cannot reach the server"),
        "not the server": (["--url", url, "--pid", str(os.getpid())], 1, f"is not the server at {url}"),
        "no such pid": (["--url", url, "--pid", str(2**22)], 1, f"no process with pid {2**22}"),
        "schedule": (["--url", url, "--pid", pid, "--schedule", "4:15,fast"], 2, "'fast' is not RATE:SECONDS"),
        "slo zero": (["--url", url, "--pid", pid, "--slo-p95", "0"], 2, "--slo-p95 must be > 0 seconds"),
    }[case]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    proc = _cli(*args, "--no-probes", "--no-pyspy")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_a_burst_meets_the_queue_bound_and_the_report_says_so(small_queue):
    options = Options(url=small_queue.url, pid=small_queue.pid, schedule=parse_schedule("1:4,40:5"),
                      schedule_text="1:4,40:5", slo=Slo(3.0, 0.01), shape=Shape(max_tokens=(8, 16), timeout_s=20),
                      probes=[], pyspy=False, repeats=0, max_batch=1)
    progress = io.StringIO()
    report = Runner(options, progress).run()
    low, burst = report.steps
    assert low.errors == {} and low.client_p95_s is not None and low.server_p95_s is not None
    # One decode slot: every engine iteration decodes exactly one sequence.
    assert low.batch_mean == pytest.approx(1.0), low.unmeasured
    assert not any(k.startswith("server batch") for k in low.unmeasured), low.unmeasured
    assert burst.errors.get("429", 0) > 0 and burst.queue_waiting_max is not None
    knee = report.knee()
    assert (knee.last_good, knee.first_bad) == (0, 1) and "429" in knee.reason
    assert report.bottleneck().resource == "queue bound"
    # The server's one decode slot was full while its queue held requests: saturated too, behind the 429s.
    batch = next(c for c in report.bottleneck().candidates if c.resource == "batch size")
    assert batch.score >= 1, [e.text() for e in batch.evidence]
    assert "step 2/2: 40 req/s offered" in progress.getvalue()
    assert low.busiest_thread_cores is not None and low.busiest_thread_cores >= 0
    assert _loadtest_threads() == []


@pytest.mark.bpf
@pytest.mark.root
def test_probes_and_pyspy_fill_the_step_figures(small_queue, require_bpf):
    options = Options(url=small_queue.url, pid=small_queue.pid, schedule=parse_schedule("2:4"), schedule_text="2:4",
                      slo=Slo(5.0), shape=Shape(max_tokens=(8, 16)), probes=["runqueue", "syscalls", "offcpu"],
                      pyspy=True,
                      repeats=1)
    runner = Runner(options, io.StringIO())
    report = runner.run()
    first, repeat = report.steps
    assert repeat.repeat_of == 0
    assert first.runq_wait_per_s is not None and first.syscalls_per_request and first.syscalls_per_request > 10
    assert first.cpu_cores is not None and first.cpu_cores > 0
    assert "gc" in first.unmeasured  # not enabled: a reason, not a zero
    assert runner.stacks[0], "py-spy sampled nothing during the step"
    # torch's and the HTTP server's pool threads sleep through a light step; each is off-CPU all of it,
    # and that is kept out of the by-kind figure (the probe's time and /proc's count must agree).
    assert first.idle_threads and first.idle_threads >= 1, first.unmeasured
    idle_s = sum(first.idle_offcpu_by_kind.values())
    assert idle_s == pytest.approx(first.idle_threads, rel=0.15), (first.idle_offcpu_by_kind, first.idle_threads)
    assert max(first.idle_offcpu_by_kind, key=first.idle_offcpu_by_kind.get) == "lock (futex)"  # parked pools
    assert report.noise()["achieved_rps"] is not None


def test_a_short_max_batch_sweep_restarts_the_server_per_value_and_marks_an_optimum(tmp_path):
    """Two settings, three-second steps (~25 s): each value gets its own server, its batch limit and a noise figure."""
    out, page = tmp_path / "sweep.json", tmp_path / "sweep.html"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    proc = _cli("--sweep", "max-batch=1,4", "--schedule", "2:3,16:3", "--slo-p95", "3", "--max-tokens", "8-16",
                "--no-probes", "--no-pyspy", "--repeats", "1", "-o", str(out), "--html", str(page))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    data = json.loads(out.read_text())
    assert [p["value"] for p in data["points"]] == [1, 4]
    assert data["command"].startswith("infersight loadtest --sweep max-batch=1,4 --schedule 2:3,16:3 --slo-p95 3")
    assert all(run["settings"]["command"] == data["command"] for run in data["reports"])
    for value, run in zip((1, 4), data["reports"], strict=True):
        assert run["settings"]["server_args"][:4] == ["--threads", "1", "--max-batch", str(value)]
        first = run["steps"][0]
        assert first["max_batch"] == value and first["batch_mean"] is not None, first["unmeasured"]
        assert 1.0 <= first["batch_mean"] <= value
    by_value = {p["value"]: p for p in data["points"]}
    assert all(p["tokens_noise"] is not None for p in data["points"])  # the repeated step measured it
    scored = [p for p in data["points"] if p["tokens_per_s"] is not None]
    if scored:
        most = max(scored, key=lambda p: p["tokens_per_s"])
        best = by_value[data["optimum"]]
        assert most["value"] in data["tied"] and data["optimum"] in data["tied"]
        assert all(best["p95_s"] <= by_value[v]["p95_s"] for v in data["tied"])
        assert "<- optimum" in proc.stdout
    else:
        assert data["optimum"] is None
    charts = re.findall(r'<svg class="chart" id="(sweep-\w+)" data-points="(\d+)"', page.read_text())
    assert len(charts) == 5


def test_traffic_already_at_the_server_is_measured_and_said(tmp_path):
    """A real server with a real 2 req/s load of someone else's (the demo's own): the report measures it before
    the first step, warns, and says the load at the server; without it, "no background traffic"."""
    from agent.loadtest import html
    from agent.loadtest.command import summary
    from agent.loadtest.server_metrics import ServerSampler

    server = start_server(["--threads", "1"])
    log = open(tmp_path / "load.log", "w")
    load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", server.url, "--rate", "2",
                             "--duration", "600", "--max-tokens", "8-16", "--no-progress"], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)

    def run_once() -> tuple:
        options = Options(url=server.url, pid=None, schedule=parse_schedule("1:4"), schedule_text="1:4",
                          slo=Slo(30.0, 0.5), shape=Shape(max_tokens=(8, 16), timeout_s=30), probes=[], pyspy=False,
                          repeats=0, background_s=10.0)
        progress = io.StringIO()
        return Runner(options, progress).run(), progress.getvalue()

    try:
        # The load generator's first requests reach the server before the measurement begins.
        sampler = ServerSampler(server.url + "/metrics")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not sampler.background(1.0).rps:
            pass
        busy, said = run_once()
        load.terminate()
        load.wait(30)
        # Drained: nothing running or waiting at the server any more.
        while time.monotonic() < deadline + 60 and _queue(server.url) != 0:
            time.sleep(0.5)
        quiet, _ = run_once()
    finally:
        if load.poll() is None:
            load.kill()
        log.close()
        server.stop()
    b = busy.background
    # Poisson at 2 req/s over 10 s: 20 expected; 5..50 holds with certainty short of a broken measurement.
    assert b is not None and b.metric == "vllm:request_success" and 0.5 <= b.rps <= 5.0, b
    assert re.search(r"loadtest: WARNING: the server already served \d\.\d\d req/s of other traffic", said), said
    assert re.search(r"step 1/1: 1 req/s offered \(\+\d\.\d\d background = \d\.\d\d at the server\)", said), said
    assert summary(busy).splitlines()[0].startswith("WARNING: the server already served ")
    page = html.render(busy)
    assert '<p id="background" class="warning">WARNING: the server already served' in page
    assert busy.to_dict()["background"]["rps"] == pytest.approx(b.rps)
    assert quiet.background.rps == 0, quiet.background
    assert summary(quiet).splitlines()[0].startswith("no background traffic: the server finished no request")


def _queue(url: str) -> float:
    """Requests running or waiting at the bundled server, from its /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name in ("vllm:num_requests_running", "vllm:num_requests_waiting") for s in f.samples)
