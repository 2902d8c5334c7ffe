"""The JSON API under /api: status, and stored windows by target and time range."""

from __future__ import annotations

import json
import math
import re

from flask import Blueprint, Response, abort, current_app, jsonify, request

from dashboards import view
from dashboards.errors import json_errors, require_store
from dashboards.limits import Busy
from dashboards.members import members_view
from dashboards.query import unix_seconds_arg

bp = Blueprint("api", __name__, url_prefix="/api")
json_errors(bp, 400, 404, 413, 503)

# Hard caps: one request may never make the agent build more than this (a window with its stacks is
# ~40 KB; 10,000 of them once grew the agent by 1.4 GB). Older windows: ask again with until=.
MAX_WINDOWS = 1000
MAX_RESPONSE_BYTES = 8 << 20
_PAGE = 25
_LIMIT_RE = re.compile(r"[0-9]{1,7}")


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


# /api/members reads at most this many windows: enough for 15 minutes at the default 5 s interval.
MEMBERS_WINDOWS = 180


@bp.get("/members")
def members():
    """A family target's processes over the last `minutes` (default 15): roles, pids, shares (dashboards.members)."""
    store = require_store()
    target = request.args.get("target") or ""
    raw = request.args.get("minutes", "15")
    if not _LIMIT_RE.fullmatch(raw) or not 1 <= int(raw) <= 1440:
        abort(400, description=f"minutes must be an integer in 1..1440, got {raw!r}")
    latest = store.latest(target) if target else None
    if latest is None:
        abort(404, description=f"no stored window for target {target!r}")
    try:
        with current_app.config["LIST_GATE"].claim():
            found = store.windows(target=target, since=latest.end - 60 * int(raw), limit=MEMBERS_WINDOWS,
                                  with_profiles=False)
    except Busy as exc:
        resp = jsonify(error=str(exc))
        resp.status_code, resp.headers["Retry-After"] = 429, "2"
        return resp
    return jsonify({"target": target, **members_view(found)})


@bp.get("/windows")
def windows():
    store = require_store()
    limit_raw = request.args.get("limit", "100")
    # ASCII digits only: str.isdigit() accepts '²', which int() then refuses.
    if not _LIMIT_RE.fullmatch(limit_raw) or not 1 <= int(limit_raw) <= MAX_WINDOWS:
        abort(400, description=f"limit must be an integer in 1..{MAX_WINDOWS}, got {limit_raw!r}")
    target, since, until = request.args.get("target") or None, unix_seconds_arg("since"), unix_seconds_arg("until")
    try:
        with current_app.config["LIST_GATE"].claim():
            parts, cut = _newest_first(store, target, since, until, int(limit_raw))
    except Busy as exc:
        resp = jsonify(error=str(exc))
        resp.status_code, resp.headers["Retry-After"] = 429, "2"
        return resp
    resp = Response("[" + ",".join(reversed(parts)) + "]", mimetype="application/json")
    if cut is not None:
        resp.headers["X-Infersight-Truncated"] = (f"{MAX_RESPONSE_BYTES} byte cap reached after {len(parts)} windows; "
                                                  f"older ones: ask again with until={cut!r}")
    return resp


def _newest_first(store, target: str | None, since: float | None, until: float | None,
                  limit: int) -> tuple[list[str], float | None]:
    """JSON texts of the newest `limit` windows, newest first, read a page at a time and stopped at the
    byte cap; with the `until=` that continues the list when the cap cut it short."""
    parts: list[str] = []
    starts: list[float] = []
    seen: set[tuple[str, float]] = set()
    size = 2
    bound = until
    while len(parts) < limit:
        page = [w for w in store.windows(target=target, since=since, until=bound, limit=_PAGE)[::-1]
                if (w.target, w.start) not in seen]
        if not page:
            break
        for w in page:
            text = json.dumps(w.to_dict(), separators=(",", ":"))
            if size + len(text) + 1 > MAX_RESPONSE_BYTES:
                # `until` is exclusive: windows sharing the cut's start go to the next answer, all of them.
                while starts and starts[-1] == w.start:
                    starts.pop()
                    parts.pop()
                if not parts:
                    abort(413, description=f"one window at start {w.start!r} is larger than the "
                                           f"{MAX_RESPONSE_BYTES} byte cap; use the flame graph endpoints")
                return parts, starts[-1]
            parts.append(text)
            starts.append(w.start)
            seen.add((w.target, w.start))
            size += len(text) + 1
            # Next page: inclusive of this start, then deduplicated (several targets share a start).
            bound = math.nextafter(w.start, math.inf)
            if len(parts) == limit:
                break
    return parts, None
