"""End to end: the real agent watching the bundled workload; a GC fault after warm-up; the loopback receiver
hears a firing alert naming gc within the detector's delay plus group_wait, then a resolve after the fault is off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agent.alerts.service import SCHEDULER_SECONDS
from analysis.detector import LatencyDetector
from tests.live import free_port, terminate, wait_http, workload_target, write_agent_config

INTERVAL = 2.0
WARMUP_WINDOWS = 10
GROUP_WAIT = 2.0
DETECTOR = LatencyDetector(warmup_windows=WARMUP_WINDOWS)
# docs/detector.md: an episode opens 1-6 windows after the fault's first window (synthetic bench; the recorded
# scenarios 1-5, gc 2). The fault lands mid-window, so one more; three windows of slack for a loaded 2-core host,
# where the workload's GC pauses vary the most. Measured on this host at a 2 s interval: firing 7.5-11 s after
# the fault went on (load average 5), so the bound below (32 s) is about three times that.
OPEN_WINDOWS = 1 + 6 + 3
# Closing needs close_windows calm windows in a row; the queue built up under the fault drains first.
# Measured: the resolve came 5.6 s after the fault went off (bound 30 s).
CLOSE_WINDOWS = 1 + DETECTOR.close_windows + 6
# After the detector: the alert scheduler's tick, then process start-up of the POST and the store commits.
SLACK_SECONDS = SCHEDULER_SECONDS + 9.0
FIRING_BOUND = OPEN_WINDOWS * INTERVAL + GROUP_WAIT + SLACK_SECONDS
RESOLVE_BOUND = CLOSE_WINDOWS * INTERVAL + SLACK_SECONDS


def fault(port: int, token: str, on: bool) -> None:
    subprocess.run([sys.executable, "-m", "workload", "fault", "gc", "on" if on else "off", "--url",
                    f"http://127.0.0.1:{port}", "--token", token], check=True, capture_output=True, timeout=30)


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.bpf
# Once in the full suite (2026-12-05 ~04:00 UTC) the resolve did not come within 30 s of the fault going off (the
# firing came at 6.1 s as usual); alone it passed 3 of 3 right after (resolve 5.7-9.6 s). The cause was not found.
# This VM's CPU can slow for minutes with nothing in the guest to show it (latency +40-100 %, docs/BENCHMARKS.md
# "Healthy traffic at the soak's rate"), during which the server's latency cannot return to its baseline.
@pytest.mark.flaky(reruns=1, reason="the VM's CPU slows for minutes at times (docs/BENCHMARKS.md, soak-rate "
                   "recording): a resolve can wait for it; one such failure in a full suite, 3 of 3 passes alone")
def test_gc_fault_reaches_the_receiver_as_firing_then_resolved(require_bpf, tmp_path: Path, receivers) -> None:
    hook = receivers()
    port, agent_port = free_port(), free_port()
    token = f"alerts-e2e-{uuid.uuid4().hex[:12]}"
    config = write_agent_config(tmp_path, agent_port, f"""
        [stacks]
        rate_hz = 29
        [detector]
        warmup_windows = {WARMUP_WINDOWS}
        [alerts]
        group_wait_seconds = {GROUP_WAIT}
        [[receivers]]
        name = "e2e"
        url = "{hook.url}"
    """, workload_target(token, port, timeout_seconds=10), interval=INTERVAL)
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
        switched_on = time.time()
        while not hook.accepted() and time.time() - switched_on < FIRING_BOUND:
            time.sleep(0.2)
        assert hook.accepted(), f"no firing within {FIRING_BOUND:g} s of the fault"
        firing_delay = hook.accepted()[0].at - switched_on
        print(f"firing arrived {firing_delay:.1f} s ({firing_delay / INTERVAL:.1f} windows) after the fault "
              f"went on; bound {FIRING_BOUND:g} s")
        firing = hook.accepted()[0].doc

        fault(port, token, False)
        switched_off = time.time()
        while (not any(a.doc["status"] == "resolved" for a in hook.accepted())
               and time.time() - switched_off < RESOLVE_BOUND):
            time.sleep(0.2)
        resolved_at = [a.at for a in hook.accepted() if a.doc["status"] == "resolved"]
        if resolved_at:
            delay = resolved_at[0] - switched_off
            print(f"resolve arrived {delay:.1f} s ({delay / INTERVAL:.1f} windows) after the fault went off; "
                  f"bound {RESOLVE_BOUND:g} s")
    finally:
        for proc in (agent, load, server):
            terminate(proc)
        logs.close()

    assert firing["status"] == "firing"
    alert = firing["alerts"][0]
    assert alert["labels"]["cause"] == "gc" and alert["labels"]["target"] == "workload"
    assert alert["annotations"]["description"].startswith("1. gc ")
    resolved = [a.doc for a in hook.accepted() if a.doc["status"] == "resolved"]
    assert resolved, f"no resolve within {RESOLVE_BOUND:g} s of the fault going off"
    # The resolve ends the alert as last sent: the first one, or the critical one if the regression escalated,
    # in which case the escalation message also ended the first (docs/alerts.md, Escalation).
    firings = [a.doc for a in hook.accepted() if a.doc["status"] == "firing"]
    assert resolved[0]["alerts"][0]["fingerprint"] == firings[-1]["alerts"][0]["fingerprint"]
    ended = {a["fingerprint"] for doc in firings for a in doc["alerts"] if a["status"] == "resolved"}
    assert ended | {resolved[0]["alerts"][0]["fingerprint"]} >= {alert["fingerprint"]}
