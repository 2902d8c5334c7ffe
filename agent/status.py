"""`infersight status`: ask the running agent over HTTP and print what it says."""

from __future__ import annotations

import json
import re
import sys
import time
import unicodedata
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from analysis.summary import summary_line

# Terminal escape sequences, removed whole so that what is left reads plainly: CSI (ESC [ ... or the C1 byte
# 0x9b), OSC (ESC ] ... or 0x9d, up to BEL or ST: titles, hyperlinks, clipboard writes) and any other ESC pair.
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                      r"|\x1b[ -~]?")
# Control (C0, C1, DEL), format (bidi overrides and isolates, zero-width), line/paragraph separators, and lone
# surrogates (JSON may hold "\ud800"; printing one raises).
_DROPPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def printable(text: str) -> str:
    """`text` safe to print on a terminal: reasons and errors come from watched processes (command lines, error
    texts, /metrics answers), and an escape sequence in one must not rewrite the screen or a bidi override
    reverse what the operator reads. Whitespace controls become a space; the rest is dropped."""
    text = _ESCAPES.sub("", text)
    return "".join(" " if ch in "\t\n\r\v\f" else ch for ch in text
                   if ch in "\t\n\r\v\f" or unicodedata.category(ch) not in _DROPPED)


def fetch(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/status", timeout=timeout) as resp:
        return json.load(resp)


def fetch_optional(url: str, path: str, timeout: float = 5.0) -> tuple[Any, str | None]:
    """(answer, None), or (None, why not): the agent may have no store or no receivers (503 with its reason)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}{path}", timeout=timeout) as resp:
            return json.load(resp), None
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read()).get("error")
        except (ValueError, AttributeError):
            why = None
        return None, why or f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, str(exc)


def fetch_findings(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """Open regressions (/api/regressions?open=1) and the alert outbox (/api/alerts), each with why it is missing."""
    regressions, regressions_error = fetch_optional(url, "/api/regressions?open=1&limit=500", timeout)
    alerts, alerts_error = fetch_optional(url, "/api/alerts", timeout)
    return {"open_regressions": regressions, "open_regressions_error": regressions_error,
            "alerts": alerts, "alerts_error": alerts_error}


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def alert_state(alert: dict | None) -> str:
    """pending (inside group wait), firing with its delivery (delivered, or what is still pending or failed),
    resolved; or none."""
    if alert is None:
        return "none raised"
    if alert["state"] == "waiting":
        return "pending (group wait: nothing sent yet)"
    notes = alert.get("notifications") or []
    by_state: dict[str, list[str]] = {}
    for n in notes:
        by_state.setdefault(n["state"], []).append(n["receiver"])
    if not notes:
        delivery = "no receiver wants it"
    elif set(by_state) == {"sent"}:
        delivery = "delivered"
    else:
        delivery = ", ".join(f"{len(rs)} {state} ({', '.join(sorted(set(rs)))})"
                             for state, rs in sorted(by_state.items()))
    return f"{alert['state']}, {delivery}"


def _findings_lines(target: str, findings: dict[str, Any], now: float) -> list[str]:
    if findings["open_regressions"] is None:
        return [f"  regressions: not known ({findings['open_regressions_error']})"]
    mine = [r for r in findings["open_regressions"] if r.get("target") == target]
    if not mine:
        return ["  regression: none open"]
    alerts = {a["regression_id"]: a for a in (findings["alerts"] or {}).get("alerts", [])}
    lines = []
    for r in mine:
        lines.append(f"  regression {r['id']}: {r['top_cause']}, {r['severity']}, open since {_when(r['opened_at'])} "
                     f"({_duration(now - r['opened_at'])})")
        if findings["alerts"] is None:
            lines.append(f"  alert: not known ({findings['alerts_error']})")
        else:
            lines.append(f"  alert: {alert_state(alerts.get(r['id']))}")
    return lines


def _outbox_line(findings: dict[str, Any]) -> str | None:
    alerts = findings["alerts"]
    if alerts is None:
        return None
    if not alerts["receivers"]:
        return "alert outbox: no receivers configured"
    parts = []
    for r in alerts["receivers"]:
        oldest = "" if r["oldest_pending_seconds"] is None else f" (oldest {_duration(r['oldest_pending_seconds'])})"
        parts.append(f"{r['name']} {r['pending']} pending{oldest}, {r['failed']} failed, {r['expired']} expired")
    return "alert outbox: " + "; ".join(parts)


def format_status(data: dict, findings: dict[str, Any] | None = None, now: float | None = None) -> str:
    """The agent's status; with `findings` (fetch_findings), each target's open regression and its alert, and
    the outbox backlog per receiver."""
    now = time.time() if now is None else now
    lines = [f"agent up {data['uptime_seconds']:.0f} s, {data['windows_written']} windows, "
             f"{data['late_ticks']} late ticks, {data['dropped_windows']} dropped"]
    for t in data["targets"]:
        # How it ended (or why it serves no one), the reason it waits: the one line an operator needs first.
        why = t.get("down") or (t.get("detail") if t["state"] != "watching" else None)
        family = f", {t['members']} processes" if t.get("members") else ""
        lines.append(f"target {t['name']}: {'down' if t.get('down') else t['state']} (pid {t['pid']}{family})"
                     + (f" — {why}" if why else ""))
        lines.extend(f"target {t['name']}: {problem}" for problem in t.get("problems") or ())
        if findings is not None:
            lines += _findings_lines(t["name"], findings, now)
    if findings is not None and (outbox := _outbox_line(findings)) is not None:
        lines.append(outbox)
    for s in data["sources"]:
        reason = f" — {s['reason']}" if s.get("reason") else ""
        lines.append(f"source {s['source']}: {s.get('state')}{reason}")
    for w in data["latest"].values():
        lines.append(f"latest {summary_line(w)}")
    return "\n".join(printable(line) for line in lines)


def main(url: str, as_json: bool = False) -> int:
    try:
        data = fetch(url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(printable(f"infersight: no agent answering at {url}: {exc}"), file=sys.stderr)
        return 1
    findings = fetch_findings(url)
    # json.dumps escapes every control and non-ASCII character (ensure_ascii), so --json needs no filter.
    print(json.dumps({**data, **findings}, indent=2) if as_json else format_status(data, findings))
    return 0
