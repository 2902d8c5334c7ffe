"""End to end: the bundled workload under load, the real agent (`infersight run`), its store and /metrics;
a workload restart mid-run, then a `kill -9` of the agent during writes and a restart of it."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.store import Store
from tests.live import free_port, start_server, terminate, wait_http, workload_target, write_agent_config

INTERVAL = 3.0
SOURCES = ("syscalls", "offcpu", "gc", "tcp", "runqueue", "process", "stacks", "latency", "gpu")


def nvml_has_gpu() -> bool:
    """What NVML itself says: at least one device (asked directly, not through the agent's GpuSource)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    finally:
        pynvml.nvmlShutdown()


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as resp:
        return json.load(resp)


def start_agent(config, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.bpf
def test_workload_load_agent_restart_and_crash(require_bpf, tmp_path):
    port, agent_port = free_port(), free_port()
    tag = f"e2e-{uuid.uuid4().hex[:12]}"
    store_dir = tmp_path / "store"
    # 1 s py-spy segments: every 3 s window then holds stacks, which the test asserts. The server answers /metrics
    # between decode steps, and this 2-core VM is shared with the load too: 10 s for a scrape.
    config = write_agent_config(tmp_path, agent_port, """
        [stacks]
        rate_hz = 29
        segment_seconds = 1
        steady_segment_seconds = 1
    """, workload_target(tag, port, timeout_seconds=10), interval=INTERVAL)
    os.chmod(tmp_path, 0o700)
    logs = open(tmp_path / "processes.log", "w")
    server = load = agent = None
    try:
        server = start_server(port, tag, logs)
        first_pid = server.pid
        load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", f"http://127.0.0.1:{port}",
                                 "--rate", "3", "--duration", "200", "--no-progress"], stdout=logs, stderr=logs)
        agent = start_agent(config, logs)
        wait_http(f"http://127.0.0.1:{agent_port}/api/status", 60)

        time.sleep(30)
        first_stopping = time.time()
        terminate(server)  # a deploy: the server restarts with a new pid
        server = start_server(port, tag, logs)
        second_pid, second_ready = server.pid, time.time()
        time.sleep(30)

        metrics = scrape(f"http://127.0.0.1:{agent_port}/metrics")
        # The crash: kill -9 while windows are being written, then count what the store kept.
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        store = Store.open(store_dir)
        before_crash = store.windows(target="workload")
        store.close()

        agent = start_agent(config, logs)
        wait_http(f"http://127.0.0.1:{agent_port}/api/status", 60)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and status(agent_port)["windows_written"] < 2:
            time.sleep(1)
        terminate(agent)
        assert agent.returncode == 0, "the agent stops cleanly on SIGTERM"
    finally:
        for proc in (agent, load, server):
            terminate(proc)
        logs.close()

    log_text = (tmp_path / "processes.log").read_text()[-4000:]
    store = Store.open(store_dir)
    after = store.windows(target="workload")
    store.close()

    # The store holds consecutive windows of the first server, then of the second.
    first = [w for w in before_crash if w.pid == first_pid]
    second = [w for w in before_crash if w.pid == second_pid]
    assert len(first) >= 7 and len(second) >= 7, (len(first), len(second), log_text)
    for run in (first, second):
        for a, b in zip(run, run[1:]):
            assert a.end == b.start, "windows of one process are back to back"
            assert b.duration == pytest.approx(INTERVAL, abs=1.5)

    # Every source is filled while a server is up and serving. Outside that, windows say why not: the old
    # server's last window covers its exit ("gone"), the new one's first ones predate its port ("refused").
    assert "gone" in first[-1].errors.get("process", ""), first[-1].errors
    serving = [w for w in first[1:] if w.end <= first_stopping] + [w for w in second if w.start >= second_ready]
    assert len(serving) >= 12
    for w in serving:
        missing = [s for s in SOURCES if getattr(w, s) is None]
        assert not missing, (missing, w.errors)
        assert w.syscalls.counts and w.offcpu.seconds > 0 and w.process.rss_bytes > 0
        assert w.stacks.samples > 0 and (w.stacks.active or w.stacks.idle)
        # Whatever NVML says about this host, the window agrees: figures with a GPU, the reason without.
        assert w.gpu.available is nvml_has_gpu(), w.gpu
        assert w.gpu.available or "no GPU on this host" in w.gpu.reason
    assert sum(w.latency.requests for w in serving) > 0
    # The window in which the server exits has no gc reading (the probe drops a gone target), not a zero.
    assert sum(w.gc.collections for w in first if w.gc is not None) > 0

    # The restart lost at most one window: the new pid's first window starts within one interval of
    # the old pid's last window's end.
    gap = second[0].start - first[-1].end
    assert 0 <= gap <= INTERVAL + 1.0, gap

    # /metrics served the probe series for the target.
    assert any(name == "infersight_syscalls_total" and ("target", "workload") in labels
               for name, labels in metrics)
    for series in ("infersight_offcpu_seconds_total", "infersight_gc_collections_total",
                   "infersight_tcp_retransmits_total", "infersight_runqueue_latency_seconds_count",
                   "infersight_process_cpu_seconds_total"):
        assert (series, (("target", "workload"),)) in metrics, series
    assert metrics[("infersight_agent_windows_total", ())] >= 14

    # kill -9 lost no committed window; the restarted agent continued the same history after them.
    assert [w.to_dict() for w in after[:len(before_crash)]] == [w.to_dict() for w in before_crash]
    resumed = after[len(before_crash):]
    assert len(resumed) >= 2 and resumed[0].start >= before_crash[-1].end
