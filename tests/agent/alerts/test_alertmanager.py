"""A real Alertmanager (Debian prometheus-alertmanager) on loopback: our alerts go in through /api/v2/alerts,
come out of its webhook and resolve; our own v4 webhook payload matches its output key for key, type for type;
an escalation reaches the route for severity="critical" and leaves no warning alert active."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from agent.alerts.payloads import fingerprint
from agent.alerts.service import AlertService
from agent.config import config_from_dict
from agent.store import Store
from tests.agent.alerts.conftest import say_closed, say_opened, say_updated

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def shape(value):
    """The structure of a JSON value: dicts by key, lists by their first item, scalars by type name."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def start_alertmanager(tmp_path: Path, config: str):
    """A real Alertmanager on a free loopback port with this config; returns (process, base URL, log file)."""
    if ALERTMANAGER is None:
        pytest.fail("prometheus-alertmanager is missing; 'make setup' installs it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(textwrap.dedent(config))
    log = open(tmp_path / "alertmanager.log", "w")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={conf}", f"--storage.path={tmp_path / 'am-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"alertmanager did not start: {(tmp_path / 'alertmanager.log').read_text()}")
            time.sleep(0.2)
    return proc, url, log


def stop_alertmanager(proc: subprocess.Popen, log) -> None:
    proc.terminate()
    proc.wait(10)
    log.close()


@pytest.fixture
def alertmanager(tmp_path: Path, receivers):
    hook = receivers()
    proc, url, log = start_alertmanager(tmp_path, f"""
        route:
          receiver: hook
          group_by: ['alertname', 'target']
          group_wait: 1s
          group_interval: 1s
          repeat_interval: 1h
        receivers:
          - name: hook
            webhook_configs:
              - url: "{hook.url}"
                send_resolved: true
    """)
    yield url, hook
    stop_alertmanager(proc, log)


@pytest.fixture
def alertmanager_by_severity(tmp_path: Path, receivers):
    """Routed as Alertmanager users route: severity="critical" to the pager, the rest to the team's hook."""
    team, pager = receivers(), receivers()
    proc, url, log = start_alertmanager(tmp_path, f"""
        route:
          receiver: team
          group_by: ['alertname', 'target']
          group_wait: 1s
          group_interval: 1s
          repeat_interval: 1h
          routes:
            - receiver: pager
              matchers: ['severity="critical"']
        receivers:
          - name: team
            webhook_configs:
              - url: "{team.url}"
                send_resolved: true
          - name: pager
            webhook_configs:
              - url: "{pager.url}"
                send_resolved: true
    """)
    yield url, team, pager
    stop_alertmanager(proc, log)


def wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_through_real_alertmanager_and_v4_matches_its_output(tmp_path: Path, alertmanager, receivers,
                                                            make_reg) -> None:
    am_url, hook = alertmanager
    direct = receivers()
    conf = config_from_dict({"store_dir": str(tmp_path / "store"),
                             "alerts": {"group_wait_seconds": 0, "host": "am-host",
                                        "external_url": "http://infersight.test:9464"},
                             "receivers": [{"name": "am", "kind": "alertmanager", "url": am_url},
                                           {"name": "direct", "kind": "webhook", "url": direct.url}]})
    with Store.open(conf.store_dir) as store:
        service = AlertService(conf, store)
        service.start()
        try:
            reg = make_reg("am-1", opened_at=time.time() - 120)
            say_opened(service, reg)
            wait_for(lambda: any(a.doc["status"] == "firing" for a in hook.arrivals), 30, "Alertmanager's firing")
            reg.closed_at = time.time()
            say_closed(service, reg)
            wait_for(lambda: any(a.doc["status"] == "resolved" for a in hook.arrivals), 30,
                     "Alertmanager's resolved")
            wait_for(lambda: len(direct.accepted()) == 2, 10, "our direct webhook")
        finally:
            service.stop()

    am_firing = next(a.doc for a in hook.arrivals if a.doc["status"] == "firing")
    am_resolved = next(a.doc for a in hook.arrivals if a.doc["status"] == "resolved")
    ours_firing, ours_resolved = (a.doc for a in direct.accepted())
    assert am_firing["alerts"][0]["status"] == "firing" and am_resolved["alerts"][0]["status"] == "resolved"
    # What went in came out: labels, annotations, and Alertmanager's fingerprint is the one we compute.
    am_alert, our_alert = am_firing["alerts"][0], ours_firing["alerts"][0]
    assert am_alert["labels"] == our_alert["labels"]
    assert am_alert["annotations"] == our_alert["annotations"]
    assert am_alert["fingerprint"] == our_alert["fingerprint"] == fingerprint(our_alert["labels"])
    # The v4 payload, field for field: same keys at every level, same JSON types.
    for ours, theirs in ((ours_firing, am_firing), (ours_resolved, am_resolved)):
        assert shape(ours) == shape(theirs)
        assert ours["version"] == theirs["version"] == "4"
    assert am_firing["alerts"][0]["endsAt"] == our_alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert am_firing["groupLabels"] == ours_firing["groupLabels"] == {"alertname": "InferenceLatencyRegression",
                                                                      "target": "workload"}


def active_alerts(am_url: str) -> list[dict]:
    with urllib.request.urlopen(f"{am_url}/api/v2/alerts?active=true&silenced=false&inhibited=false",
                                timeout=5) as resp:
        return json.load(resp)


@pytest.mark.slow
def test_escalation_through_real_alertmanager_routes_to_the_pager(tmp_path: Path, alertmanager_by_severity,
                                                                  receivers, make_reg) -> None:
    am_url, team, pager = alertmanager_by_severity
    direct = receivers()
    conf = config_from_dict({"store_dir": str(tmp_path / "store"),
                             "alerts": {"group_wait_seconds": 0, "host": "am-host",
                                        "external_url": "http://infersight.test:9464"},
                             "receivers": [{"name": "am", "kind": "alertmanager", "url": am_url},
                                           {"name": "direct", "kind": "webhook", "url": direct.url}]})

    def fired(hook, severity: str, status: str) -> bool:
        return any(a["labels"]["severity"] == severity and a["status"] == status
                   for arrival in hook.arrivals for a in arrival.doc["alerts"])

    with Store.open(conf.store_dir) as store:
        service = AlertService(conf, store)
        service.start()
        try:
            opened = time.time() - 120
            say_opened(service, make_reg("esc-am", opened_at=opened))
            wait_for(lambda: fired(team, "warning", "firing"), 30, "the warning at the team's route")
            assert pager.arrivals == []
            say_updated(service, make_reg("esc-am", opened_at=opened, severity="critical"))
            wait_for(lambda: fired(pager, "critical", "firing"), 30, "the critical alert at the pager route")
            wait_for(lambda: fired(team, "warning", "resolved"), 30, "the warning alert's end")
            # Alertmanager holds one alert for the regression now: the critical one.
            active = active_alerts(am_url)
            assert [(a["labels"]["regression"], a["labels"]["severity"]) for a in active] == [("esc-am", "critical")]
            reg = make_reg("esc-am", opened_at=opened, severity="critical")
            reg.closed_at = time.time()
            say_closed(service, reg)
            wait_for(lambda: fired(pager, "critical", "resolved"), 30, "the critical alert's resolve")
            wait_for(lambda: len(direct.accepted()) == 3, 10, "our direct webhook")
        finally:
            service.stop()

    assert active_alerts(am_url) == []
    # Our direct escalation message has what Alertmanager's routes split: the new alert and the end of the old,
    # with the same fingerprints Alertmanager gave them.
    am_alerts = {a["labels"]["severity"]: a["fingerprint"]
                 for arrival in team.arrivals + pager.arrivals for a in arrival.doc["alerts"]}
    escalation = direct.accepted()[1].doc
    assert [(a["status"], a["labels"]["severity"], a["fingerprint"]) for a in escalation["alerts"]] == [
        ("firing", "critical", am_alerts["critical"]), ("resolved", "warning", am_alerts["warning"])]
    # Same v4 keys and alert shape as Alertmanager's own messages; commonLabels holds what both alerts share
    # (all but severity), as Alertmanager computes it for a group of several alerts.
    theirs = next(a.doc for a in team.arrivals)
    assert set(escalation) == set(theirs)
    assert all(shape(a) == shape(theirs["alerts"][0]) for a in escalation["alerts"])
    assert escalation["commonLabels"] == {k: v for k, v in escalation["alerts"][0]["labels"].items() if k != "severity"}
