"""End to end: the real agent watching the bundled workload; a GC fault after warm-up; the loopback receiver
hears a firing alert naming gc within the detector's delay plus group_wait, then a resolve after the fault is off.

Needs the detector (agent.detection, analysis.detector) and the daemon passing its findings to the alerts
(`detection.add_listener(self.alerts)`); on a tree without the detector it skips and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.live import free_port, terminate, wait_http

INTERVAL = 2.0
WARMUP_WINDOWS = 10
GROUP_WAIT = 2.0
# The detector needs a few fault windows to be sure; on this shared 2-core VM allow generously for it.
DETECTOR_DELAY = 90.0


def fault(port: int, token: str, on: bool) -> None:
    subprocess.run([sys.executable, "-m", "workload", "fault", "gc", "on" if on else "off", "--url",
                    f"http://127.0.0.1:{port}", "--token", token], check=True, capture_output=True, timeout=30)


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.bpf
def test_gc_fault_reaches_the_receiver_as_firing_then_resolved(require_bpf, tmp_path: Path, receivers) -> None:
    hook = receivers()
    port, agent_port = free_port(), free_port()
    token = f"alerts-e2e-{uuid.uuid4().hex[:12]}"
    config = tmp_path / "infersight.toml"
    config.write_text(textwrap.dedent(f"""
        interval_seconds = {INTERVAL}
        store_dir = "{tmp_path / 'store'}"
        listen = "127.0.0.1:{agent_port}"
        [stacks]
        rate_hz = 29
        [detector]
        warmup_windows = {WARMUP_WINDOWS}
        [alerts]
        group_wait_seconds = {GROUP_WAIT}
        [[receivers]]
        name = "e2e"
        url = "{hook.url}"
        [[targets]]
        name = "workload"
        process_regex = "admin-token {token}"
        [targets.latency]
        preset = "workload"
        url = "http://127.0.0.1:{port}/metrics"
        timeout_seconds = 10
    """))
    os.chmod(tmp_path, 0o700)
    logs = open(tmp_path / "processes.log", "w")
    server = load = agent = None
    try:
        server = subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port), "--admin-token",
                                   token], stdout=logs, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{port}/health", 120)
        load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", f"http://127.0.0.1:{port}",
                                 "--rate", "3", "--duration", "600", "--no-progress"], stdout=logs, stderr=logs)
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                 stdout=logs, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{agent_port}/api/status", 60)
        time.sleep(INTERVAL * (WARMUP_WINDOWS + 4))
        assert hook.arrivals == [], "no alert before the fault"

        fault(port, token, True)
        switched_on = time.monotonic()
        while not hook.accepted() and time.monotonic() - switched_on < DETECTOR_DELAY + GROUP_WAIT:
            time.sleep(0.5)
        assert hook.accepted(), f"no firing within {DETECTOR_DELAY + GROUP_WAIT} s of the fault"
        firing = hook.accepted()[0].doc

        fault(port, token, False)
        switched_off = time.monotonic()
        while (not any(a.doc["status"] == "resolved" for a in hook.accepted())
               and time.monotonic() - switched_off < 3 * DETECTOR_DELAY):
            time.sleep(0.5)
    finally:
        for proc in (agent, load, server):
            terminate(proc)
        logs.close()

    assert firing["status"] == "firing"
    alert = firing["alerts"][0]
    assert alert["labels"]["cause"] == "gc" and alert["labels"]["target"] == "workload"
    assert alert["annotations"]["description"].startswith("1. gc ")
    resolved = [a.doc for a in hook.accepted() if a.doc["status"] == "resolved"]
    assert resolved, "no resolve after the fault was switched off"
    assert resolved[0]["alerts"][0]["fingerprint"] == alert["fingerprint"]
