"""Notification bodies: Alertmanager webhook v4, Slack incoming-webhook blocks, Alertmanager /api/v2/alerts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from analysis.regression import Cause, FunctionShift, Grower, Neighbour, Regression, Writer

ALERTNAME = "InferenceLatencyRegression"
# A watched server whose process ended (cause `down`): a fact, not a latency call, routed under its own name.
DOWN_ALERTNAME = "InferenceServerDown"
# Go's zero time, which Alertmanager writes as endsAt of an alert that has not ended.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
MAX_DESCRIPTION_CHARS = 4000
MAX_CAUSES = 8
MAX_FUNCTIONS = 5
# Function names and evidence come from the watched process (its frames, its answers): bounded per item, so one
# hostile name cannot push the ranked causes out of a message.
MAX_FUNCTION_CHARS = 120
MAX_EVIDENCE_CHARS = 300
# Slack's limit on one section's text.
SLACK_SECTION_CHARS = 3000
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
    # The regression's ranked causes and grown functions, for formats that lay them out themselves (Slack).
    causes: tuple[Cause, ...] = ()
    functions: tuple[FunctionShift, ...] = ()
    # Set on the firing that tells receivers this alert is now more severe: the severity it had before.
    escalated_from: str | None = None


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


def printable(text: str) -> str:
    """Text from the target as a person should read it: every character that is invisible or moves the text
    around it (C0/C1 controls, bidi overrides and isolates, zero-width and other format characters, line and
    paragraph separators, lone surrogates) written as its \\x/\\u escape, so a name can neither hide, reverse
    nor break the line it sits in."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def _escape_char(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cause_line(rank: int, cause: Cause) -> str:
    return f"{rank}. {cause.label} ({cause.score:.2f}): {shorten(printable(cause.evidence), MAX_EVIDENCE_CHARS)}"


def function_name(shift: FunctionShift) -> str:
    return shorten(printable(shift.function), MAX_FUNCTION_CHARS)


def alert_labels(reg: Regression, host: str) -> dict[str, str]:
    name = DOWN_ALERTNAME if reg.top_cause == "down" else ALERTNAME
    return {"alertname": name, "target": reg.target, "host": host, "cause": reg.top_cause,
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


def _process_words(p: Neighbour | Grower | Writer) -> str:
    """Another process as an alert names it: its command line (else comm) as code, and its user; escaped, capped."""
    user = f", user {shorten(printable(p.user), 64)}" if p.user else ""
    return f"`{shorten(printable(p.cmdline or p.comm), 80)}`{user}"


def alert_annotations(reg: Regression, external_url: str, now: float) -> dict[str, str]:
    state = "resolved" if reg.closed_at is not None else "open"
    if reg.top_cause == "down":
        how = shorten(printable(reg.causes[0].evidence), MAX_EVIDENCE_CHARS)
        return {"summary": f"{reg.target} is down, {reg.severity}, {state}: {how}", "description": how,
                "regression_url": regression_url(reg, external_url),
                "flamegraph_url": flamegraph_url(reg, external_url, now)}
    top = reg.causes[0] if reg.causes else None
    # A family's top cause names the process its evidence is in (its role is the process title: the target's own).
    where = (f" in pid {top.pid} ({shorten(printable(top.process), MAX_EVIDENCE_CHARS)})"
             if top is not None and top.pid is not None and top.process is not None else "")
    # CPU contention names the neighbour that held the CPU while the server waited (analysis.culprits).
    if top is not None and top.neighbours:
        n = top.neighbours[0]
        where += f" beside pid {n.pid} ({_process_words(n)}, {100 * n.share:.0f} % of the run-queue wait)"
    # A memory stall names the process that grew most (analysis.memory_growers): a neighbour, or the server's own.
    if top is not None and top.growers:
        g = top.growers[0]
        whose = "the server's own pid" if g.member else "pid"
        where += f" after {whose} {g.pid} ({_process_words(g)}) grew by {g.grew_bytes / (1 << 20):.0f} MiB"
    # A disk stall names the process that wrote most while it lasted (analysis.disk_writers).
    if top is not None and top.writers:
        w = top.writers[0]
        whose = "the server's own pid" if w.member else "pid"
        where += f" while {whose} {w.pid} ({_process_words(w)}) wrote {w.written_bytes / (1 << 20):.0f} MiB"
    summary = (f"Latency regression on {reg.target} (pid {reg.pid}), {reg.severity}, {state}: "
               f"top cause {reg.top_cause}{where}, score {reg.score:.2f}")
    lines = [cause_line(i, c) for i, c in enumerate(reg.causes[:MAX_CAUSES], 1)]
    if not lines:
        lines = ["no cause ranked yet"]
    if reg.functions:
        lines.append("functions that grew: " + ", ".join(
            f"{function_name(f)} {f.baseline_share:.0%}->{f.current_share:.0%}" for f in reg.functions[:MAX_FUNCTIONS]))
    description = "\n".join(lines)
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS - 1] + "…"
    return {"summary": summary, "description": description,
            "regression_url": regression_url(reg, external_url),
            "flamegraph_url": flamegraph_url(reg, external_url, now)}


def webhook_v4(events: Sequence[AlertEvent], receiver: str, external_url: str) -> dict[str, Any]:
    """Alertmanager's webhook message, version 4: one group holding these alerts (one, or at an escalation the
    alert at its new severity and the one it replaces, resolved), its common labels and annotations computed as
    Alertmanager does: those every alert has with the same value."""
    first = events[0]
    group_labels = {"alertname": first.labels["alertname"], "target": first.labels["target"]}
    group_key = "{}/{infersight}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}"
    return {
        "receiver": receiver,
        "status": "firing" if any(e.status == "firing" for e in events) else "resolved",
        "alerts": [{
            "status": e.status,
            "labels": dict(e.labels),
            "annotations": dict(e.annotations),
            "startsAt": rfc3339(e.starts_at),
            "endsAt": rfc3339(e.ends_at) if e.ends_at is not None else GO_ZERO_TIME,
            "generatorURL": e.generator_url,
            "fingerprint": e.fingerprint,
        } for e in events],
        "groupLabels": group_labels,
        "commonLabels": _common([e.labels for e in events]),
        "commonAnnotations": _common([e.annotations for e in events]),
        "externalURL": external_url,
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
    }


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    return {k: v for k, v in maps[0].items() if all(m.get(k) == v for m in maps[1:])}


def alertmanager_v2(events: Sequence[AlertEvent], firing_ends_at: float) -> list[dict[str, Any]]:
    """The body of POST /api/v2/alerts. A firing alert carries an endsAt past the next repeat, so it stays
    active while we keep re-sending and lapses on its own if this agent is gone for good."""
    return [{
        "labels": dict(e.labels),
        "annotations": dict(e.annotations),
        "startsAt": rfc3339(e.starts_at),
        "endsAt": rfc3339(e.ends_at if e.ends_at is not None else firing_ends_at),
        "generatorURL": e.generator_url,
    } for e in events]


def mrkdwn(text: str) -> str:
    """Slack's escaping: &, < and > are its control characters (<url|text> links, <!channel> mentions, <@U1>
    users); as entities they show as themselves and control nothing."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """Inline code, escaped. mrkdwn has no escape inside `...`: a backtick would end the span and let the rest
    be formatted, so it is shown as the look-alike U+02CB."""
    return "`" + mrkdwn(text.replace("`", "\u02cb")) + "`"


def _link(url: str, text: str) -> str:
    return f"<{mrkdwn(url.replace('|', '%7C'))}|{mrkdwn(text)}>"


def _mrkdwn_text(text: str) -> dict[str, Any]:
    # verbatim: Slack adds no links of its own (bare URLs, #channel names) to what we wrote.
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _fit(lines: list[str], limit: int) -> str:
    """Whole lines while they fit in `limit` characters, with room kept to say how many were left out."""
    out: list[str] = []
    used = -1  # no newline before the first line
    for i, line in enumerate(lines):
        left_after = len(lines) - i - 1
        room_for_note = len(f"\n… and {left_after} more") if left_after else 0
        if used + 1 + len(line) + room_for_note > limit:
            out.append(f"… and {left_after + 1} more")
            break
        out.append(line)
        used += 1 + len(line)
    return "\n".join(out)


def slack(event: AlertEvent) -> dict[str, Any]:
    """Slack incoming-webhook JSON: a header, the facts, the ranked causes, the links. Every string that is not
    ours is escaped (mrkdwn) and made printable; function names are inline code."""
    resolved = event.status == "resolved"
    a, lab = event.annotations, event.labels
    icon = ":white_check_mark:" if resolved else (":rotating_light:" if lab["severity"] == "critical" else ":warning:")
    verb = "Resolved" if resolved else f"Escalated to {lab['severity']}" if event.escalated_from else "Firing"
    title = (f"{verb}: {printable(lab['target'])} is down" if lab["cause"] == "down"
             else f"{verb}: latency regression on {printable(lab['target'])}")
    severity = lab["severity"] + (f" (was {event.escalated_from})" if event.escalated_from else "")
    causes = [mrkdwn(cause_line(i, c)) for i, c in enumerate(event.causes[:MAX_CAUSES], 1)] or ["no cause ranked yet"]
    if event.functions:
        causes.append("*Functions that grew*")
        causes += [f"• {code(function_name(f))} {f.baseline_share:.0%} → {f.current_share:.0%}"
                   for f in event.functions[:MAX_FUNCTIONS]]
    return {
        "text": mrkdwn(f"{title} — {printable(a['summary'])}"),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": shorten(mrkdwn(f"{icon} {title}"), 150),
                                        "emoji": True}},
            {"type": "section", "fields": [
                _mrkdwn_text(f"*Severity*\n{mrkdwn(severity)}"),
                _mrkdwn_text(f"*Top cause*\n{mrkdwn(lab['cause'])}"),
                _mrkdwn_text(f"*Host*\n{mrkdwn(printable(lab['host']))}"),
                _mrkdwn_text(f"*Started*\n{rfc3339(event.starts_at)}"),
            ]},
            {"type": "section", "text": _mrkdwn_text(_fit(["*Causes, best first*"] + causes, SLACK_SECTION_CHARS))},
            {"type": "context", "elements": [_mrkdwn_text(
                f"{_link(a['regression_url'], 'regression')} · "
                f"{_link(a['flamegraph_url'], 'differential flame graph')} · fingerprint {code(event.fingerprint)}")]},
        ],
    }


def encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
