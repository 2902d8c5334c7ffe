"""Turn the agent's Snapshot into plain dicts for the page and the JSON API."""

from __future__ import annotations

from typing import Any

from analysis.snapshot import Snapshot
from analysis.summary import window_summary


def status(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "now": round(snapshot.now),
        "uptime_seconds": round(snapshot.uptime_seconds, 1),
        "windows_written": snapshot.windows_written,
        "late_ticks": snapshot.late_ticks,
        "dropped_windows": snapshot.dropped_windows,
        "errors": snapshot.errors,
        "targets": [
            {"name": t.name, "pid": t.pid, "state": t.state, "since": t.since, "detail": t.detail}
            for t in sorted(snapshot.targets.values(), key=lambda t: t.name)
        ],
        "sources": [{"source": name, **health.to_dict(), "error_count": health.errors}
                    for name, health in sorted(snapshot.health.items())],
        "latest": {name: window_summary(w) for name, w in sorted(snapshot.latest.items())},
    }
