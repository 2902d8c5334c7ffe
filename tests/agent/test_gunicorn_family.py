"""A server we did not write: gunicorn pre-forking the bundled model (a master and three workers). The real agent finds
the family by its port, watches every worker, and a GC fault switched on in one worker is detected and named with
that worker's pid; the workers' per-process series are on /metrics under their role, never a pid."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.live import free_port, terminate, wait_http, write_agent_config
from workload.launch import launched_gunicorn

pytestmark = [pytest.mark.workload, pytest.mark.bpf]
TOKEN = "gunicorn-family-token"


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def _workers(master: int) -> set[int]:
    return {int(p) for tid in os.listdir(f"/proc/{master}/task")
            for p in open(f"/proc/{master}/task/{tid}/children").read().split()}


def _switch_gc_in_one_worker(url: str) -> int:
    """POST the gc fault once: the worker that takes it answers with its pid."""
    req = urllib.request.Request(f"{url}/admin/faults", data=json.dumps({"name": "gc", "on": True}).encode(),
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.load(resp)
    assert answer["gc"] is True
    return int(answer["pid"])


def test_a_gc_fault_in_one_gunicorn_worker_is_named_with_that_workers_pid(require_bpf, tmp_path):
    os.chmod(tmp_path, 0o700)
    agent_port = free_port()
    log = open(tmp_path / "processes.log", "w")
    load = agent = None
    with launched_gunicorn(3, token=TOKEN, metrics_dir=str(tmp_path)) as server:
        port = int(server.url.rsplit(":", 1)[1])
        wait_http(f"{server.url}/health", 180)
        deadline = time.monotonic() + 180
        while len(_workers(server.proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        workers = _workers(server.proc.pid)
        config = write_agent_config(tmp_path, agent_port, f"""
            [stacks]
            rate_hz = 29
            [detector]
            warmup_windows = 12
            [[targets]]
            name = "gunicorn"
            port = {port}
            [targets.latency]
            preset = "workload"
            url = "{server.url}/metrics"
            timeout_seconds = 10
        """, interval=1)
        try:
            load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", server.url, "--rate", "4",
                                     "--duration", "600", "--no-progress"], stdout=log, stderr=log)
            agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                     stdout=log, stderr=subprocess.STDOUT)
            base = f"http://127.0.0.1:{agent_port}"
            wait_http(f"{base}/api/status", 60)
            deadline = time.monotonic() + 240
            status: dict = {}
            while time.monotonic() < deadline:
                status = _get(f"{base}/api/status")
                target = next((t for t in status["targets"] if t["name"] == "gunicorn"), None)
                state = _get(f"{base}/api/overview")["detector"].get("gunicorn")
                if target and target["members"] == 4 and state == "healthy":
                    break
                time.sleep(2)
            target = next(t for t in status["targets"] if t["name"] == "gunicorn")
            assert target["pid"] == server.proc.pid and target["members"] == 4, target  # the master leads
            hot = _switch_gc_in_one_worker(server.url)
            assert hot in workers
            found = None
            deadline = time.monotonic() + 180
            while found is None and time.monotonic() < deadline:
                for reg in _get(f"{base}/api/regressions?target=gunicorn&open=1"):
                    if reg["causes"] and reg["causes"][0]["label"] == "gc":
                        found = reg
                time.sleep(2)
            assert found is not None, "no gc regression opened within 180 s of the fault"
            top = found["causes"][0]
            assert top["pid"] == hot, (hot, top)
            assert f"in pid {hot} " in top["evidence"]
            metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
            members = [line for line in metrics.splitlines() if line.startswith("infersight_member_processes{")]
            assert members and not any("pid=" in line for line in members), members
            assert sum(float(line.rsplit(" ", 1)[1]) for line in members) == 4
            # One health series per source and target, as for one process: no member's pid in a label.
            sources = [line for line in metrics.splitlines() if line.startswith("infersight_source_up{")]
            assert 'source="stacks:gunicorn"' in "".join(sources)
            assert not [line for line in sources if re.search(r'source="[^"]*/[0-9]+"', line)], sources
        finally:
            terminate(load)
            terminate(agent)
            log.close()
