"""The agent as it runs (`infersight run`) watching the bundled workload, restarted by hand as a deploy would: the same
environment is a restart, another allowlisted value is a change on /api/changes and /metrics; a variable outside the
allowlist never appears in the store, the API, the page, /metrics or the agent's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.live import free_port, terminate, wait_http, workload_target, write_agent_config

SECRET = f"hf_{uuid.uuid4().hex}"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def _serve(port: int, tag: str, omp: str, log) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": omp, "HF_TOKEN": SECRET, "VLLM_LOGGING_LEVEL": "INFO"}
    proc = subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port), "--admin-token", tag],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_http(f"http://127.0.0.1:{port}/health", 120)
    return proc


def _wait(what: str, check, timeout: float = 120, seen=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := check()):
            return found
        time.sleep(1)
    raise AssertionError(f"{what} did not happen within {timeout} s" + (f"; saw {seen()}" if seen else ""))


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.root
def test_restart_and_change_seen_by_the_running_agent_and_no_secret_anywhere(require_root, tmp_path: Path):
    port, agent_port, tag = free_port(), free_port(), f"chg-{uuid.uuid4().hex[:12]}"
    os.chmod(tmp_path, 0o700)
    config = write_agent_config(tmp_path, agent_port, """
        [probes]
        syscalls = false
        offcpu = false
        gc = false
        tcp = false
        runqueue = false
        exits = false
        [stacks]
        enabled = false
        [identity]
        settle_windows = 2
    """, workload_target(tag, port))
    base = f"http://127.0.0.1:{agent_port}"
    log = open(tmp_path / "processes.log", "w")
    agent_log = tmp_path / "agent.log"
    server = agent = None
    try:
        server = _serve(port, tag, "2", log)
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                 stdout=open(agent_log, "w"), stderr=subprocess.STDOUT)
        wait_http(f"{base}/api/status", 60)
        metric = 'infersight_target_change_timestamp_seconds{target="workload"}'
        _wait("the first identity recorded", lambda: metric in _get(f"{base}/metrics"))

        terminate(server)
        server = _serve(port, tag, "2", log)  # a restart: same identity
        _wait("the restarted server watched", lambda: f'"pid": {server.pid}' in _get(f"{base}/api/status")
              or f'"pid":{server.pid}' in _get(f"{base}/api/status"))
        time.sleep(5)  # settle_windows 2 at 1 s windows, with room for a loaded host
        assert json.loads(_get(f"{base}/api/changes"))["changes"] == []

        terminate(server)
        server = _serve(port, tag, "1", log)  # a deploy that changed one allowlisted variable
        changes = _wait("the change recorded", lambda: json.loads(_get(f"{base}/api/changes"))["changes"])
        assert len(changes) == 1 and changes[0]["pid"] == server.pid
        assert changes[0]["diff"] == [{"part": "env", "before": "OMP_NUM_THREADS=2", "after": "OMP_NUM_THREADS=1"}]
        assert changes[0]["after"]["env"] == {"OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "INFO"}
        assert changes[0]["after"]["dists"]["torch"]

        shown = {"api": _get(f"{base}/api/changes"), "metrics": _get(f"{base}/metrics"),
                 "page": _get(f"{base}/targets/workload"), "status": _get(f"{base}/api/status"),
                 "regressions": _get(f"{base}/api/regressions")}
        assert SECRET.encode() in Path(f"/proc/{server.pid}/environ").read_bytes()  # the ground truth
    finally:
        for proc in (agent, server):
            terminate(proc)
        log.close()
    for where, text in shown.items():
        assert SECRET not in text and "HF_TOKEN" not in text, where
    assert SECRET not in agent_log.read_text()
    assert "OMP_NUM_THREADS=2 → OMP_NUM_THREADS=1" in agent_log.read_text()
    store = b"".join(p.read_bytes() for p in (tmp_path / "store").iterdir() if p.is_file())
    assert SECRET.encode() not in store and b'"OMP_NUM_THREADS":"1"' in store


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.root
def test_a_slower_build_opens_a_regression_labelled_change(require_root, tmp_path: Path):
    """The workload restarted with --no-cache (more work per token) under steady load: the old baseline stays, the
    new build regresses against it, and the regression is put down to the change, its command line first."""
    port, agent_port, tag = free_port(), free_port(), f"chg-{uuid.uuid4().hex[:12]}"
    os.chmod(tmp_path, 0o700)
    config = write_agent_config(tmp_path, agent_port, """
        [probes]
        syscalls = false
        offcpu = false
        gc = false
        tcp = false
        runqueue = false
        exits = false
        [stacks]
        enabled = false
        [detector]
        warmup_windows = 12
        [identity]
        settle_windows = 2
    """, workload_target(tag, port), interval=2)
    base = f"http://127.0.0.1:{agent_port}"
    log = open(tmp_path / "processes.log", "w")
    server = agent = load = None
    try:
        server = _serve(port, tag, "1", log)
        load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", f"http://127.0.0.1:{port}",
                                 "--rate", "4", "--duration", "600", "--no-progress"], stdout=log, stderr=log)
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                 stdout=log, stderr=subprocess.STDOUT)
        wait_http(f"{base}/api/status", 60)
        _wait("the detector armed", lambda: 'infersight_detector_armed{target="workload"} 1.0'
              in _get(f"{base}/metrics"), timeout=200)
        time.sleep(20)  # healthy windows of the old build after warm-up
        terminate(server)
        server = subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port), "--admin-token",
                                   tag, "--no-cache"], stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        found = _wait("a regression labelled change", lambda: [
            r for r in json.loads(_get(f"{base}/api/regressions")) if r["top_cause"] == "change"],
            # A loaded host (load average 16) once took minutes to start the new build serving.
            timeout=330, seen=lambda: ([(r["top_cause"], r["opened_at"], r["causes"][0]["evidence"][:200])
                                        for r in json.loads(_get(f"{base}/api/regressions"))],
                                       json.loads(_get(f"{base}/api/changes"))["changes"][:1],
                                       _get(f"{base}/api/overview")[:600]))
        change = json.loads(_get(f"{base}/api/changes"))["changes"][0]
    finally:
        for proc in (agent, load, server):
            terminate(proc)
        log.close()
    assert change["diff"][0]["part"] == "cmdline" and "--no-cache" in change["diff"][0]["after"]
    assert found[0]["change_id"] == change["id"]
    assert "--no-cache" in found[0]["causes"][0]["evidence"]
