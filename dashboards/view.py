"""Turn the agent's Snapshot into plain dicts for the page and the JSON API."""

from __future__ import annotations

from typing import Any

from analysis.redact import redact_text
from analysis.snapshot import Snapshot
from analysis.summary import window_summary


def status(snapshot: Snapshot) -> dict[str, Any]:
    """Everything the page and /api/status show; every string in it has URL credentials hidden, whichever
    source put them there (a target's command line, a scrape error, a health reason)."""
    return _redacted(_status(snapshot))


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


def _status(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "now": round(snapshot.now),
        "uptime_seconds": round(snapshot.uptime_seconds, 1),
        "windows_written": snapshot.windows_written,
        "late_ticks": snapshot.late_ticks,
        "dropped_windows": snapshot.dropped_windows,
        "errors": snapshot.agent_errors,
        "missing_readings": snapshot.missing_readings,
        "targets": [
            # `down`: why it serves no one while its down episode is open (its process ended, or its port is
            # closed), else null.
            {"name": t.name, "pid": t.pid, "state": t.state, "since": t.since, "detail": t.detail,
             "down": snapshot.down.get(t.name), "members": t.members, "problems": list(t.problems)}
            for t in sorted(snapshot.targets.values(), key=lambda t: t.name)
        ],
        # A process_regex that matched more than the agent watches says so (allowed_users, max_targets).
        "skipped": [{"target": name, "line": sk.line()}
                    for name, sk in sorted(snapshot.skipped.items()) if sk.line()],
        "sources": [{"source": name, **health.to_dict(), "error_count": health.error_count}
                    for name, health in sorted(snapshot.health.items())],
        "latest": {name: window_summary(w) for name, w in sorted(snapshot.latest.items())},
    }
