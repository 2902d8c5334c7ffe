"""The bodies the alerter queues for one fixture regression, byte for byte as the release that kept a JSON copy of
the regression in the alert row wrote them (fixtures/payload_golden.json, written once by that code with
`python -m tests.agent.alerts.test_payload_golden`): the alert now reads its regression from the regressions
table, and Slack, Alertmanager and webhook receivers must not see a single byte change."""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from agent.alerts.alerter import Alerter
from agent.alerts.config import AlertsConfig, ReceiverConfig
from agent.store import Store
from tests.agent.alerts.conftest import make_regression

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "payload_golden.json"
START = 1_764_572_400.25


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bodies(directory: Path) -> list[dict[str, str]]:
    """Open, group wait, a re-rank, an escalation, a repeat and the close, told as the detector tells it (the
    regression saved first); every queued notification in order."""
    clock = Clock(START)
    receivers = (ReceiverConfig(name="slack", kind="slack", url="https://hooks.slack.invalid/services/T/B/x"),
                 ReceiverConfig(name="am", kind="alertmanager", url="http://127.0.0.1:2"),
                 ReceiverConfig(name="hook", url="http://127.0.0.1:1/"))
    with Store.open(directory) as store:
        alerter = Alerter(AlertsConfig(group_wait_seconds=10, repeat_interval_seconds=600), receivers, store,
                          host="gpu-7", external_url="http://gpu-7:9464", clock=clock)

        def told(move, reg) -> None:
            store.save_regression(reg)
            move(reg)

        reg = make_regression("golden-1", opened_at=START)
        told(alerter.regression_opened, reg)
        clock.now += 10
        alerter.tick()
        clock.now += 60
        reranked = dataclasses.replace(reg, causes=list(reversed(reg.causes)), score=7.25)
        told(alerter.regression_updated, reranked)
        clock.now += 60
        told(alerter.regression_updated, dataclasses.replace(reranked, severity="critical", score=12.5))
        clock.now += 600
        alerter.tick()
        clock.now += 30
        told(alerter.regression_closed, dataclasses.replace(reranked, severity="critical", closed_at=clock.now - 5))
        rows = store.query("SELECT receiver, status, body FROM alert_notifications ORDER BY id")
    return [{"receiver": r, "status": s, "body": bytes(b).decode()} for r, s, b in rows]


def test_payloads_are_byte_for_byte_what_the_json_copy_gave(tmp_path: Path) -> None:
    got = bodies(tmp_path / "store")
    expected = json.loads(GOLDEN.read_text())
    assert [(g["receiver"], g["status"]) for g in got] == [(e["receiver"], e["status"]) for e in expected]
    assert len(got) >= 12  # firing, repeat, escalation, resolve for each of three receivers
    for g, e in zip(got, expected, strict=True):
        assert g["body"] == e["body"], f"{g['receiver']} {g['status']} body changed"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps(bodies(Path(tmp) / "store"), indent=1) + "\n")
    sys.exit(0)
