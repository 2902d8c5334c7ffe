"""The detector's findings for the page and the JSON API: open regressions and a link to their differential flame graph."""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, request, url_for

from analysis.regression import Regression, regression_to_dict
from dashboards.errors import json_errors, require_store

bp = Blueprint("findings", __name__, url_prefix="/api")
json_errors(bp, 400, 503)

MAX_REGRESSIONS = 500
# Without a baseline range from the detector, compare with the quarter hour before the episode.
FALLBACK_BASELINE_SECONDS = 900.0


def diff_url(r: Regression, now: float) -> str:
    """The differential flame graph: the regression's own time against its baseline's."""
    baseline_to = r.baseline_end if r.baseline_end is not None else r.opened_at - 60.0
    baseline_from = r.baseline_start if r.baseline_start is not None else baseline_to - FALLBACK_BASELINE_SECONDS
    return url_for("profiles.flamegraph_diff", target=r.target, kind="active", baseline_from=f"{baseline_from:.0f}",
                   baseline_to=f"{baseline_to:.0f}", **{"from": f"{r.opened_at - 30.0:.0f}",
                                                        "to": f"{(r.closed_at or now):.0f}"})


def regression_view(r: Regression, now: float) -> dict[str, Any]:
    data = regression_to_dict(r)
    data["top_cause"] = r.top_cause
    data["open_seconds"] = round((r.closed_at or now) - r.opened_at, 1)
    data["flamegraph_url"] = diff_url(r, now)
    return data


def open_regressions() -> list[dict[str, Any]]:
    """Open regressions from the live detector, for the banner; [] when the agent runs none."""
    findings = current_app.config.get("FINDINGS")
    if findings is None:
        return []
    now = time.time()
    snap = findings()
    return [regression_view(f.regression, now) for _, f in sorted(snap.findings.items())
            if f.regression is not None]


def detector_states() -> dict[str, str]:
    findings = current_app.config.get("FINDINGS")
    return {} if findings is None else {name: f.state for name, f in findings().findings.items()}


@bp.get("/regressions")
def regressions():
    store = require_store()
    raw = request.args.get("limit", "50")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_REGRESSIONS:
        abort(400, description=f"limit must be an integer in 1..{MAX_REGRESSIONS}, got {raw!r}")
    target = request.args.get("target") or None
    open_only = request.args.get("open") in ("1", "true")
    now = time.time()
    found = store.regressions(target=target, open_only=open_only, limit=int(raw))
    return jsonify([regression_view(r, now) for r in found])
