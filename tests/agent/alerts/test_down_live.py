"""`kill -9` of a watched server, live: the real agent opens a `down` episode naming the signal and its sender, the
receiver hears it, /metrics says up 0, a real Prometheus fires InfersightTargetDown; the restarted server closes it
on the baseline it had (no second warm-up)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.dashboards.promql import RULES
from tests.live import free_port, start_server, terminate, wait_http, workload_target, write_agent_config

INTERVAL = 1.0
WARMUP_WINDOWS = 8


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def metric(agent: str, line_start: str) -> float | None:
    with urllib.request.urlopen(f"{agent}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(line_start + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


def firing(prom: str, alertname: str) -> list[dict]:
    query = urllib.parse.urlencode({"query": f'ALERTS{{alertname="{alertname}",alertstate="firing"}}'})
    return get_json(f"{prom}/api/v1/query?{query}")["data"]["result"]


def wait_until(what: str, timeout: float, pred):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:g} s")


@pytest.mark.slow
@pytest.mark.workload
@pytest.mark.bpf
def test_kill_9_of_the_server_is_an_incident_and_its_restart_closes_it(require_bpf, tmp_path: Path, receivers):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is missing: 'make setup' installs the Debian package")
    hook = receivers()
    port, agent_port, prom_port = free_port(), free_port(), free_port()
    tag = f"down-{uuid.uuid4().hex[:12]}"
    os.chmod(tmp_path, 0o700)
    config = write_agent_config(tmp_path, agent_port, f"""
        [stacks]
        enabled = false
        [detector]
        warmup_windows = {WARMUP_WINDOWS}
        [alerts]
        group_wait_seconds = 0
        [[receivers]]
        name = "pager"
        url = "{hook.url}"
    """, workload_target(tag, port, timeout_seconds=5), interval=INTERVAL)
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "prometheus.yml").write_text(textwrap.dedent(f"""
        global: {{scrape_interval: 1s, evaluation_interval: 1s}}
        rule_files: [rules.yml]
        scrape_configs:
          - job_name: infersight
            static_configs: [{{targets: ["127.0.0.1:{agent_port}"]}}]
    """))
    agent_url, prom_url = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{prom_port}"
    log = open(tmp_path / "processes.log", "w")
    server = again = load = agent = prom = None
    try:
        server = start_server(port, tag, log)
        load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", f"http://127.0.0.1:{port}",
                                 "--rate", "4", "--duration", "900", "--no-progress"], stdout=log, stderr=log)
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                 stdout=log, stderr=subprocess.STDOUT)
        prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        wait_http(f"{agent_url}/api/status", 60)
        wait_http(f"{prom_url}/-/ready", 60)
        # Armed: the baseline is learned, so "not warming up again" below means something.
        wait_until("the detector armed", 240,
                   lambda: metric(agent_url, 'infersight_detector_armed{target="workload"}') == 1.0)
        wait_until("Prometheus scraped up 1", 30, lambda: get_json(
            f"{prom_url}/api/v1/query?query=infersight_target_up%3D%3D1")["data"]["result"])
        assert firing(prom_url, "InfersightTargetDown") == []

        killer = subprocess.run(["kill", "-KILL", str(server.pid)])
        killed_at = time.time()
        assert killer.returncode == 0
        server.wait()
        down = wait_until("a down regression", 10, lambda: [
            r for r in get_json(f"{agent_url}/api/regressions?open=1") if r["top_cause"] == "down"])[0]
        opened_after = down["opened_at"] - killed_at
        assert opened_after <= 2 * INTERVAL + 0.5, f"down opened {opened_after:.2f} s after the kill"
        evidence = down["causes"][0]["evidence"]
        assert evidence.startswith(f"pid {server.pid} killed by SIGKILL (signal 9) from pid ") and "(kill)" in evidence
        assert down["severity"] == "critical"
        assert metric(agent_url, 'infersight_target_up{target="workload"}') == 0.0
        assert metric(agent_url, 'infersight_regression_active{target="workload"}') == 1.0
        assert metric(agent_url, 'infersight_detector_armed{target="workload"}') == 1.0
        status = {t["name"]: t for t in get_json(f"{agent_url}/api/status")["targets"]}
        assert status["workload"]["state"] == "down" and "killed by SIGKILL" in status["workload"]["detail"]
        with urllib.request.urlopen(f"{agent_url}/", timeout=10) as resp:
            page = resp.read().decode()
        assert "workload is down" in page and "killed by SIGKILL" in page

        sent = wait_until("the receiver heard it", 15, lambda: [
            a.doc for a in hook.accepted() if a.doc["alerts"][0]["labels"]["cause"] == "down"])[0]
        assert sent["status"] == "firing" and sent["alerts"][0]["labels"]["severity"] == "critical"
        assert sent["alerts"][0]["labels"]["alertname"] == "InferenceServerDown"
        assert "killed by SIGKILL" in sent["alerts"][0]["annotations"]["description"]
        alert = wait_until("InfersightTargetDown firing", 30, lambda: firing(prom_url, "InfersightTargetDown"))
        assert alert[0]["metric"]["target"] == "workload"

        again = start_server(port, tag, log)
        wait_until("the down regression closed", 60, lambda: get_json(
            f"{agent_url}/api/regressions?open=1") == [])
        [closed] = [r for r in get_json(f"{agent_url}/api/regressions") if r["id"] == down["id"]]
        assert closed["closed_at"] is not None and closed["closed_at"] > down["opened_at"]
        wait_until("the resolve reached the receiver", 15, lambda: [
            a for a in hook.accepted() if a.doc["status"] == "resolved"
            and a.doc["alerts"][0]["labels"]["cause"] == "down"])
        assert metric(agent_url, 'infersight_target_up{target="workload"}') == 1.0
        # The same server again: its saved baseline goes on, no second warm-up.
        assert metric(agent_url, 'infersight_detector_armed{target="workload"}') == 1.0
        state = wait_until("a judged window of the new process", 30, lambda: get_json(
            f"{agent_url}/api/overview")["detector"].get("workload") not in (None, "down") and get_json(
            f"{agent_url}/api/overview")["detector"]["workload"])
        assert state in ("healthy", "regression"), state
        wait_until("InfersightTargetDown resolved", 30, lambda: firing(prom_url, "InfersightTargetDown") == [])
    finally:
        for proc in (prom, agent, load, server, again):
            terminate(proc)
        log.close()


def test_a_down_regression_is_its_own_alert_with_how_it_ended_in_every_format(make_reg):
    from agent.alerts.payloads import DOWN_ALERTNAME, alert_annotations, alert_labels
    from analysis.regression import Cause

    reg = make_reg(rid="workload-down-1000.000", severity="critical")
    reg.causes = [Cause("down", 0.0, "pid 4242 killed by SIGKILL (signal 9) from pid 77 (kill)")]
    labels = alert_labels(reg, "gpu-7")
    assert labels["alertname"] == DOWN_ALERTNAME and labels["cause"] == "down"
    notes = alert_annotations(reg, "http://gpu-7:9464", 2000.0)
    assert notes["summary"] == ("workload is down, critical, open: "
                                "pid 4242 killed by SIGKILL (signal 9) from pid 77 (kill)")
    assert notes["description"] == "pid 4242 killed by SIGKILL (signal 9) from pid 77 (kill)"
