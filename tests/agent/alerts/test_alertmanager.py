"""A real Alertmanager (Debian prometheus-alertmanager) on loopback: our alerts go in through /api/v2/alerts,
come out of its webhook and resolve; our own v4 webhook payload matches its output key for key, type for type."""

from __future__ import annotations

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

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def shape(value):
    """The structure of a JSON value: dicts by key, lists by their first item, scalars by type name."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


@pytest.fixture
def alertmanager(tmp_path: Path, receivers):
    if ALERTMANAGER is None:
        pytest.fail("prometheus-alertmanager is missing; 'make setup' installs it")
    hook = receivers()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(textwrap.dedent(f"""
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
    """))
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
    yield url, hook
    proc.terminate()
    proc.wait(10)
    log.close()


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
            service.regression_opened(reg)
            wait_for(lambda: any(a.doc["status"] == "firing" for a in hook.arrivals), 30, "Alertmanager's firing")
            reg.closed_at = time.time()
            service.regression_closed(reg)
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
