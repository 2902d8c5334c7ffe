"""The HTML status page: targets, source health, the latest window's figures."""

from __future__ import annotations

from flask import Blueprint, abort, current_app, render_template

from dashboards import findings, view

bp = Blueprint("page", __name__)


@bp.get("/")
def index():
    state = current_app.config["STATE"]
    if state is None:
        abort(503, description="the agent has not started collecting yet")
    alerts = current_app.config.get("ALERTS")
    return render_template("status.html", status=view.status(state.snapshot()),
                           regressions=findings.open_regressions(), detector=findings.detector_states(),
                           alerts=alerts() if alerts else None)
