"""The pages beyond the overview: a target's charts, regressions, the flame graph viewer; and their small JSON helpers."""

from __future__ import annotations

import time

from flask import Blueprint, abort, current_app, jsonify, render_template

from dashboards import findings
from dashboards.errors import json_errors, require_store
from dashboards.series_api import RANGES

bp = Blueprint("pages", __name__)
DEFAULT_RANGE = "1h"
json_errors(bp, 404, 503)

ENDPOINTS = {
    "/api/overview": "every target's state, latest p50/p99 against the expected band, sparklines, sources, open regressions",
    "/api/status": "the agent's state: targets, sources, the latest window's figures",
    "/api/series?target=&range=15m|1h|6h|24h|7d (or from=&to=)&points=": "a target's charts, downsampled",
    "/api/offcpu?target=&range= (or from=&to=)&points=": "off-CPU seconds per second by wait kind, up to 24 h",
    "/api/windows?target=&since=&until=&limit=": "stored windows, whole",
    "/api/targets": "stored targets and their time span",
    "/api/members?target=&minutes=": "a family target's processes by role, with their share of CPU, off-CPU and GC",
    "/api/regressions?target=&open=1&limit=": "regression episodes, newest first",
    "/api/regressions/<id>": "one episode",
    "/api/changes?target=&since=&until=&limit=": "changes to what targets run (build, command line, allowlisted "
                                                 "environment, distributions, model files), newest first",
    "/api/changes/<id>": "one change with both identities",
    "/api/changes/<id>/report": "the change's before/after report: latency at equal load, tokens/s, CPU per token, "
                                "syscalls per request, GC pause per second, each with its interval and verdict",
    "/api/alerts": "alert receivers and their delivery state",
    "/api/flamegraph?target=&kind=&from=&to=&format=folded|svg|speedscope|pprof": "flame graph exports",
    "/api/flamegraph/diff?target=&kind=&baseline_from=&baseline_to=&from=&to=&format=svg|folded|json": "differential",
    "/api/flamegraph/tree?target=&kind=&from=&to=[&baseline_from=&baseline_to=]": "d3-flame-graph JSON",
    "/debug/pprof/profile?target=&seconds=": "pprof pull, like Go's net/http/pprof",
}


def default_range(first_start: float | None, now: float) -> str:
    """The smallest preset range that holds every stored window, so a freshly started agent's minutes fill the
    charts instead of a sliver at the right edge; 1h when there is nothing yet or more than the longest preset."""
    if first_start is not None:
        for name, seconds in RANGES.items():
            if now - first_start <= seconds:
                return name
    return DEFAULT_RANGE


@bp.get("/targets/<name>")
def target(name: str):
    store = current_app.config.get("STORE")
    first = store.first_start(name) if store is not None else None
    return render_template("target.html", target=name, interval=current_app.config.get("INTERVAL_SECONDS") or 5.0,
                           ranges=list(RANGES), default_range=default_range(first, time.time()))


@bp.get("/regressions")
def regressions():
    return render_template("regressions.html")


@bp.get("/regressions/<rid>")
def regression(rid: str):
    return render_template("regression.html", rid=rid)


@bp.get("/flamegraph")
def flamegraph():
    return render_template("flamegraph.html")


@bp.get("/api/")
def api_docs():
    return jsonify({"endpoints": ENDPOINTS, "docs": "docs/api.md in the infersight source tree"})


@bp.get("/api/regressions/<rid>")
def regression_json(rid: str):
    store = require_store()
    found = store.regression(rid)
    if found is None:
        abort(404, description=f"no regression with id {rid!r}")
    return jsonify(findings.regression_view(found, time.time()))
