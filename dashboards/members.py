"""A family target's processes over a time range, by role, with each one's share of the family's CPU, off-CPU and GC:
what the target page lists under "Processes" (/api/members)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from analysis.window import MemberReading, Window

FIGURES = ("cpu_seconds", "offcpu_seconds", "gc_pause_seconds")


def members_view(windows: Iterable[Window]) -> dict[str, Any]:
    """Roles of the windows' members, oldest window first in `windows`: the latest pids and RSS of each role, its
    sums of each figure and its share of the family's; a figure no member of a role measured is None, never 0."""
    roles: dict[str, dict[str, Any]] = {}
    count = 0
    for w in windows:
        if not w.members:
            continue
        count += 1
        latest: dict[str, list[MemberReading]] = {}
        for m in w.members:
            latest.setdefault(m.role, []).append(m)
            row = roles.setdefault(m.role, {"role": m.role, **dict.fromkeys(FIGURES)})
            for figure in FIGURES:
                value = getattr(m, figure)
                if value is not None:
                    row[figure] = (row[figure] or 0.0) + value
        for role, ms in latest.items():
            rss = [m.rss_bytes for m in ms if m.rss_bytes is not None]
            roles[role].update(pids=sorted(m.pid for m in ms), rss_bytes=sum(rss) if rss else None,
                               errors=sorted({f"{k}: {v}" for m in ms for k, v in m.errors.items()}))
    totals = {f: sum(r[f] for r in roles.values() if r[f] is not None) for f in FIGURES}
    for row in roles.values():
        for figure in FIGURES:
            share = None if row[figure] is None or totals[figure] <= 0 else row[figure] / totals[figure]
            row[figure.replace("_seconds", "_share")] = share
    ordered = sorted(roles.values(), key=lambda r: (-(r["cpu_seconds"] or 0.0), r["role"]))
    return {"windows": count, "members": ordered}
