"""Flame graph exports over HTTP, and a pprof pull endpoint in the shape Parca and Pyroscope scrape."""

from __future__ import annotations

import re
import time

from flask import Blueprint, Response, abort, current_app, jsonify, request

from analysis.flamegraph.export import DIFF_FORMATS, FORMATS, PROFILE_KINDS, export, export_diff
from analysis.flamegraph.stored import from_store
from dashboards.errors import json_errors, require_store
from dashboards.limits import MAX_PROFILE_SPAN_SECONDS, Busy, busy, gated, read_deadline, wait_while_present
from dashboards.query import unix_seconds_arg

bp = Blueprint("profiles", __name__)
json_errors(bp, 400, 404, 503)

MAX_PPROF_SECONDS = 300


def _choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    value = request.args.get(name, default)
    if value not in allowed:
        abort(400, description=f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _target(store) -> str:
    target = request.args.get("target")
    names = [t.name for t in store.targets()]
    if target is None:
        if len(names) == 1:
            return names[0]
        abort(400, description=f"name a target with ?target= (stored: {', '.join(names) or 'none yet'})")
    if target not in names:
        abort(404, description=f"no stored profiles for target {target!r}")
    return target


def _send(exported, filename: str, *profiles) -> Response:
    resp = Response(exported.data, mimetype=exported.mime)
    cuts = [f"{p.truncation.range_cut} hit: read from {p.start!r} only" for p in profiles if p.truncation.range_cut]
    if cuts:
        resp.headers["X-Infersight-Truncated"] = "; ".join(cuts)
    if exported.mime == "application/octet-stream":
        resp.headers["Content-Disposition"] = f'attachment; filename="{filename}.{exported.extension}"'
    # Frame names come from the target's code: never let a browser sniff an export into HTML.
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


@bp.get("/api/targets")
@gated("SUMMARY_GATE")
def targets():
    return jsonify([{"name": t.name, "windows": t.windows, "first_start": t.first_start, "last_end": t.last_end}
                    for t in require_store().targets()])


def _read(store, target: str, since: float | None, until: float | None, kind: str, share: float = 1.0):
    """A stored profile as a request may read it: the newest day of the range at most, within the time budget."""
    return from_store(store, target, since, until, kind, max_span=MAX_PROFILE_SPAN_SECONDS,
                      deadline=read_deadline(share))


@bp.get("/api/flamegraph")
@gated("LIST_GATE")
def flamegraph():
    store = require_store()
    target = _target(store)
    kind = _choice("kind", PROFILE_KINDS, "active")
    fmt = _choice("format", FORMATS, "svg")
    since, until = unix_seconds_arg("from"), unix_seconds_arg("to")
    try:
        profile = _read(store, target, since, until, kind)
    except ValueError as exc:
        abort(400, description=str(exc))
    exported = export(profile, fmt, kind=kind, title=f"{target} — {kind}",
                      rate_hz=current_app.config.get("STACKS_RATE_HZ"))
    return _send(exported, f"{target}-{kind}", profile)


@bp.get("/api/flamegraph/diff")
@gated("LIST_GATE")
def flamegraph_diff():
    store = require_store()
    target = _target(store)
    kind = _choice("kind", PROFILE_KINDS, "active")
    fmt = _choice("format", DIFF_FORMATS, "svg")
    try:
        baseline = _read(store, target, unix_seconds_arg("baseline_from"), unix_seconds_arg("baseline_to"), kind, share=0.5)
        current = _read(store, target, unix_seconds_arg("from"), unix_seconds_arg("to"), kind, share=0.5)
    except ValueError as exc:
        abort(400, description=str(exc))
    if baseline.total() == 0 or current.total() == 0:
        abort(404, description=f"no {kind} samples in the {'baseline' if baseline.total() == 0 else 'current'} range")
    return _send(export_diff(baseline, current, fmt, title=f"{target} — {kind}: baseline vs current"),
                 f"{target}-{kind}-diff", baseline, current)


@bp.get("/debug/pprof/profile")
def pprof_profile():
    """Like Go's net/http/pprof: block for `seconds`, then answer with what was sampled meanwhile.

    The agent samples continuously and stores whole windows, so the answer is the windows that
    overlap the request's span: up to one window interval more than asked for.
    """
    store = require_store()
    target = _target(store)
    kind = _choice("kind", PROFILE_KINDS, "active")
    raw = request.args.get("seconds", "30")
    # ASCII digits only: str.isdigit() accepts '²', which int() then refuses.
    if not re.fullmatch(r"[0-9]{1,4}", raw) or not 1 <= int(raw) <= MAX_PPROF_SECONDS:
        abort(400, description=f"seconds must be an integer in 1..{MAX_PPROF_SECONDS}, got {raw!r}")
    seconds = int(raw)
    interval = float(current_app.config.get("INTERVAL_SECONDS") or 5.0)
    sleep = current_app.config.get("SLEEP") or time.sleep
    clock = current_app.config.get("CLOCK") or time.time
    # waitress gives this when channel_request_lookahead > 0: a profile must not outlive its client.
    gone = request.environ.get("waitress.client_disconnected") or (lambda: False)
    try:
        with current_app.config["PROFILE_GATE"].claim(target, exclusive=True):
            start = clock()
            if not wait_while_present(seconds, gone, sleep=sleep, clock=clock):
                return Response(status=499)
            # Wait for the window that covers the end of the span to be stored (one interval + slack).
            deadline = start + seconds + interval + 5.0
            while clock() < deadline and not gone():
                latest = store.windows(target=target, limit=1, with_profiles=False)
                if latest and latest[0].end >= start + seconds:
                    break
                sleep(0.25)
    except Busy as exc:
        return busy(str(exc), retry_after=5)
    profile = from_store(store, target, start, start + seconds, kind)
    exported = export(profile, "pprof", kind=kind, title=f"{target} — {kind}",
                      rate_hz=current_app.config.get("STACKS_RATE_HZ"))
    return _send(exported, f"{target}-{kind}")
