"""/api/changes: a target's changes (what it runs, before and after) from the store, newest first."""

from __future__ import annotations

import re

from flask import Blueprint, abort, jsonify, request

from analysis import change_report as change_report_mod
from dashboards.errors import json_errors, require_store
from dashboards.limits import gated
from dashboards.query import unix_seconds_arg

bp = Blueprint("changes_api", __name__, url_prefix="/api")
json_errors(bp, 400, 404, 503)

MAX_CHANGES = 500
_LIMIT_RE = re.compile(r"[0-9]{1,4}")


@bp.get("/changes")
def changes():
    """?target=&since=&until=&limit= (default 100): each change with its diff and both identities."""
    store = require_store()
    raw = request.args.get("limit", "100")
    if not _LIMIT_RE.fullmatch(raw) or not 1 <= int(raw) <= MAX_CHANGES:
        abort(400, description=f"limit must be an integer in 1..{MAX_CHANGES}, got {raw!r}")
    found = store.changes(request.args.get("target") or None, since=unix_seconds_arg("since"),
                          until=unix_seconds_arg("until"), limit=int(raw))
    return jsonify({"changes": [c.to_dict() for c in found]})


@bp.get("/changes/<rid>")
def change(rid: str):
    found = require_store().change(rid)
    if found is None:
        abort(404, description=f"no change {rid[:100]!r}")
    return jsonify(found.to_dict())


@bp.get("/changes/<rid>/report")
@gated("SUMMARY_GATE")
def change_report(rid: str):
    """The change's before/after report (analysis.change_report): latency at equal load and cost figures, each with
    its interval and verdict."""
    store = require_store()
    found = store.change(rid)
    if found is None:
        abort(404, description=f"no change {rid[:100]!r}")
    span = change_report_mod.SPAN_SECONDS
    around = store.changes(found.target, since=found.at - span, until=found.at + span, limit=1000)
    windows = store.windows(found.target, since=found.at - span, until=found.at + span, with_profiles=False)
    before, after = change_report_mod.sides(windows, found.at, found.pid,
                                            max((c.at for c in around if c.at < found.at), default=None),
                                            min((c.at for c in around if c.at > found.at), default=None))
    return jsonify({"change": found.id, "target": found.target, "at": found.at, "diff": found.diff,
                    **change_report_mod.compare(before, after).to_dict()})
