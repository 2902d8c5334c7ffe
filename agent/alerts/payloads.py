"""Notification bodies: Alertmanager webhook v4, Slack incoming-webhook blocks, Alertmanager /api/v2/alerts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from analysis.regression import Regression

ALERTNAME = "InferenceLatencyRegression"
# Go's zero time, which Alertmanager writes as endsAt of an alert that has not ended.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
MAX_DESCRIPTION_CHARS = 4000
MAX_CAUSES = 8
MAX_FUNCTIONS = 5
# Without a baseline range from the detector, compare with the quarter hour before the episode (as the page does).
FALLBACK_BASELINE_SECONDS = 900.0
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211


@dataclass(frozen=True)
class AlertEvent:
    """One alert as a notification carries it. Labels are fixed when the alert first goes out."""

    fingerprint: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None
    generator_url: str


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's own label-set fingerprint (prometheus/common model: FNV-1a 64 over sorted name, 0xff,
    value, 0xff), so the value we send matches the one Alertmanager shows for the same alert."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for chunk in (name.encode(), b"\xff", labels[name].encode(), b"\xff"):
            for byte in chunk:
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def rfc3339(ts: float) -> str:
    """Go's RFC3339Nano in UTC, the form Alertmanager writes."""
    text = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def alert_labels(reg: Regression, host: str) -> dict[str, str]:
    return {"alertname": ALERTNAME, "target": reg.target, "host": host, "cause": reg.top_cause,
            "severity": reg.severity, "regression": reg.id}


def regression_url(reg: Regression, external_url: str) -> str:
    return f"{external_url}/regressions/{quote(reg.id, safe='')}"


def flamegraph_url(reg: Regression, external_url: str, now: float) -> str:
    baseline_to = reg.baseline_end if reg.baseline_end is not None else reg.opened_at - 60.0
    baseline_from = reg.baseline_start if reg.baseline_start is not None else baseline_to - FALLBACK_BASELINE_SECONDS
    query = urlencode({"target": reg.target, "kind": "active", "baseline_from": f"{baseline_from:.0f}",
                       "baseline_to": f"{baseline_to:.0f}", "from": f"{reg.opened_at - 30.0:.0f}",
                       "to": f"{(reg.closed_at or now):.0f}"})
    return f"{external_url}/api/flamegraph/diff?{query}"


def alert_annotations(reg: Regression, external_url: str, now: float) -> dict[str, str]:
    state = "resolved" if reg.closed_at is not None else "open"
    summary = (f"Latency regression on {reg.target} (pid {reg.pid}), {reg.severity}, {state}: "
               f"top cause {reg.top_cause}, score {reg.score:.2f}")
    lines = [f"{i}. {c.label} ({c.score:.2f}): {c.evidence}" for i, c in enumerate(reg.causes[:MAX_CAUSES], 1)]
    if not lines:
        lines = ["no cause ranked yet"]
    if reg.functions:
        lines.append("functions that grew: " + ", ".join(
            f"{f.function} {f.baseline_share:.0%}->{f.current_share:.0%}" for f in reg.functions[:MAX_FUNCTIONS]))
    description = "\n".join(lines)
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS - 1] + "…"
    return {"summary": summary, "description": description,
            "regression_url": regression_url(reg, external_url),
            "flamegraph_url": flamegraph_url(reg, external_url, now)}


def webhook_v4(event: AlertEvent, receiver: str, external_url: str) -> dict[str, Any]:
    """Alertmanager's webhook message, version 4: one group holding this one alert."""
    group_labels = {"alertname": event.labels["alertname"], "target": event.labels["target"]}
    group_key = "{}/{infersight}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}"
    return {
        "receiver": receiver,
        "status": event.status,
        "alerts": [{
            "status": event.status,
            "labels": dict(event.labels),
            "annotations": dict(event.annotations),
            "startsAt": rfc3339(event.starts_at),
            "endsAt": rfc3339(event.ends_at) if event.ends_at is not None else GO_ZERO_TIME,
            "generatorURL": event.generator_url,
            "fingerprint": event.fingerprint,
        }],
        "groupLabels": group_labels,
        "commonLabels": dict(event.labels),
        "commonAnnotations": dict(event.annotations),
        "externalURL": external_url,
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
    }


def alertmanager_v2(event: AlertEvent, firing_ends_at: float) -> list[dict[str, Any]]:
    """The body of POST /api/v2/alerts. A firing alert carries an endsAt past the next repeat, so it stays
    active while we keep re-sending and lapses on its own if this agent is gone for good."""
    return [{
        "labels": dict(event.labels),
        "annotations": dict(event.annotations),
        "startsAt": rfc3339(event.starts_at),
        "endsAt": rfc3339(event.ends_at if event.ends_at is not None else firing_ends_at),
        "generatorURL": event.generator_url,
    }]


def slack(event: AlertEvent) -> dict[str, Any]:
    """Slack incoming-webhook JSON: a header, the facts, the ranked causes, the links."""
    resolved = event.status == "resolved"
    a, lab = event.annotations, event.labels
    icon = ":white_check_mark:" if resolved else (":rotating_light:" if lab["severity"] == "critical" else ":warning:")
    title = f"{'Resolved' if resolved else 'Firing'}: latency regression on {lab['target']}"
    return {
        "text": f"{title} — {a['summary']}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": f"{icon} {title}"[:150], "emoji": True}},
            {"type": "section", "fields": [
                {"type": "mrkdwn", "text": f"*Severity*\n{lab['severity']}"},
                {"type": "mrkdwn", "text": f"*Top cause*\n{lab['cause']}"},
                {"type": "mrkdwn", "text": f"*Host*\n{lab['host']}"},
                {"type": "mrkdwn", "text": f"*Started*\n{rfc3339(event.starts_at)}"},
            ]},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*Causes, best first*\n{a['description']}"[:3000]}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text":
                f"<{a['regression_url']}|regression> · <{a['flamegraph_url']}|differential flame graph> · "
                f"fingerprint `{event.fingerprint}`"}]},
        ],
    }


def encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
