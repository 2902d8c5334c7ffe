"""The JSON API under /api: status, and stored windows by target and time range."""

from __future__ import annotations

from flask import Blueprint, abort, current_app, jsonify, request

from dashboards import view

bp = Blueprint("api", __name__, url_prefix="/api")

MAX_WINDOWS = 10_000


@bp.get("/status")
def status():
    state = current_app.config["STATE"]
    if state is None:
        abort(503, description="the agent has not started collecting yet")
    return jsonify(view.status(state.snapshot()))


@bp.get("/alerts")
def alerts():
    source = current_app.config.get("ALERTS")
    if source is None:
        abort(503, description="this agent delivers no alerts")
    return jsonify(source())


def _float_arg(name: str) -> float | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        abort(400, description=f"{name} must be a number (unix seconds), got {raw!r}")


@bp.get("/windows")
def windows():
    store = current_app.config["STORE"]
    if store is None:
        abort(503, description="no store is configured")
    limit_raw = request.args.get("limit", "100")
    if not limit_raw.isdigit() or not 1 <= int(limit_raw) <= MAX_WINDOWS:
        abort(400, description=f"limit must be an integer in 1..{MAX_WINDOWS}, got {limit_raw!r}")
    found = store.windows(target=request.args.get("target") or None, since=_float_arg("since"),
                          until=_float_arg("until"), limit=int(limit_raw))
    return jsonify([w.to_dict() for w in found])


@bp.errorhandler(400)
@bp.errorhandler(404)
@bp.errorhandler(503)
def _json_error(err):
    return jsonify(error=err.description), err.code
