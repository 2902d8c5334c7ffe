"""JSON for the pages' charts: /api/overview (every target at a glance), /api/series and /api/offcpu (one target over a range)."""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, request

from analysis.flamegraph.profile import DEFAULT_LIMITS
from analysis.health import NOT_FAULTS
from analysis.waits import WAIT_KINDS, WAIT_LABELS, by_kind
from dashboards import findings, view
from dashboards.errors import json_errors, require_store
from dashboards.limits import Busy, busy, gated, read_deadline
from dashboards.query import unix_seconds_arg
from dashboards.series import MAX_POINTS, SERIES, series

bp = Blueprint("series", __name__, url_prefix="/api")
json_errors(bp, 400, 404, 503)

RANGES = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}
MAX_RANGE_SECONDS = 8 * 86400
SPARK_SECONDS = 3600
SPARK_POINTS = 60
MAX_CACHED_SERIES = 256




def _range() -> tuple[float, float]:
    now = time.time()
    named = request.args.get("range")
    if named is not None:
        if named not in RANGES:
            abort(400, description=f"range must be one of {', '.join(RANGES)}, got {named!r}")
        return now - RANGES[named], now
    until = unix_seconds_arg("to") or now
    since = unix_seconds_arg("from")
    since = until - 3600 if since is None else since
    if not since < until:
        abort(400, description=f"from must be before to, got from={since!r} to={until!r}")
    if until - since > MAX_RANGE_SECONDS:
        abort(400, description=f"the range may span at most {MAX_RANGE_SECONDS // 86400} days")
    return since, until


def expected_ms() -> dict[str, dict[str, float]]:
    """The detector's expected latency now, per target and percentile, in ms."""
    source = current_app.config.get("FINDINGS")
    if source is None:
        return {}
    return {name: {p: round(s * 1e3, 2) for p, s in f.expected.items()} for name, f in source().findings.items()}


def target_state(t: dict[str, Any], latest: dict[str, Any] | None, open_targets: set[str],
                 sources: list[dict[str, Any]], detector: dict[str, str]) -> str:
    if t["state"] == "down" or detector.get(t["name"]) == "down":
        return "down"
    if t["name"] in open_targets:
        return "regression open"
    if t["state"] != "watching":
        return t["state"]
    failing = [s for s in sources if s.get("state") not in NOT_FAULTS]
    if failing or (latest and latest["errors"]):
        return "source failing"
    if detector.get(t["name"]) == "warmup":
        return "learning baseline"
    return "healthy"


def _sparkline(cache: dict, store, target: str, now: float, interval: float) -> dict[str, list]:
    """The last hour in SPARK_POINTS; recomputed at most once per collection interval (the overview is polled by
    every open page, and nothing new is stored in between)."""
    hit = cache.get(target)
    if hit is not None and now - hit[0] < interval:
        return hit[1]
    s = series(store, target, now - SPARK_SECONDS, now, SPARK_POINTS, min_step=interval)
    spark = {"t": s["t"], "p99_ms": s["series"]["p99_ms"], "request_rate": s["series"]["request_rate"]}
    cache[target] = (now, spark)
    return spark


@bp.get("/overview")
@gated("SUMMARY_GATE")
def overview():
    state = current_app.config["STATE"]
    if state is None:
        abort(503, description="the agent has not started collecting yet")
    status = view.status(state.snapshot())
    regressions = findings.open_regressions()
    detector = findings.detector_states()
    expected = expected_ms()
    store = current_app.config["STORE"]
    now = time.time()
    interval = float(current_app.config.get("INTERVAL_SECONDS") or 5.0)
    targets = []
    cache = current_app.extensions.setdefault("infersight_sparklines", {})
    # Only the targets shown keep a cached sparkline: a regex target gets a new name#pid with every process.
    for name in set(cache) - {t["name"] for t in status["targets"]}:
        cache.pop(name, None)
    for t in status["targets"]:
        latest = status["latest"].get(t["name"])
        spark = None if store is None else _sparkline(cache, store, t["name"], now, interval)
        targets.append({
            **t, "status": target_state(t, latest, {r["target"] for r in regressions}, status["sources"], detector),
            "detector": detector.get(t["name"]),
            "p50_ms": latest["p50_ms"] if latest else None, "p99_ms": latest["p99_ms"] if latest else None,
            "request_rate": latest["request_rate"] if latest else None,
            "expected_ms": expected.get(t["name"], {}), "errors": latest["errors"] if latest else {},
            "sparkline": spark,
        })
    return jsonify({"now": status["now"], "uptime_seconds": status["uptime_seconds"],
                    "windows_written": status["windows_written"], "late_ticks": status["late_ticks"],
                    "dropped_windows": status["dropped_windows"], "regressions": regressions, "detector": detector,
                    "targets": targets, "sources": status["sources"]})


@bp.get("/series")
def target_series():
    store = require_store()
    target = request.args.get("target", "")
    # Not store.targets(): that counts every stored window (a week of them: 0.4 s).
    if not store.windows(target=target, limit=1, with_profiles=False):
        names = [t.name for t in store.targets()]
        abort(404, description=f"no stored windows for target {target!r} (stored: {', '.join(names) or 'none yet'})")
    raw = request.args.get("points", "600")
    if not (raw.isascii() and raw.isdigit()) or not 10 <= int(raw) <= MAX_POINTS:
        abort(400, description=f"points must be an integer in 10..{MAX_POINTS}, got {raw!r}")
    interval = float(current_app.config.get("INTERVAL_SECONDS") or 5.0)
    named = request.args.get("range")
    # A named range ("last hour") only changes when a window is stored: every open page polling it within one
    # interval gets the same answer, computed once (an hour of windows costs ~25 ms of CPU to aggregate).
    key = (target, named, raw)
    cache = current_app.extensions.setdefault("infersight_series", {})
    hit = cache.get(key) if named in RANGES else None
    if hit is not None and time.time() - hit[0] < interval:
        return jsonify(hit[1])
    since, until = _range()
    try:
        # A cache hit needs no slot; computing reads up to 8 days of windows or minutes.
        with current_app.config["LIST_GATE"].claim():
            data = series(store, target, since, until, int(raw), min_step=interval)
            data["regressions"] = [
                {"id": r.id, "opened_at": r.opened_at, "closed_at": r.closed_at, "severity": r.severity,
                 "top_cause": r.top_cause}
                for r in store.regressions(target=target, since=since, limit=200) if r.opened_at < until]
    except Busy as exc:
        return busy(str(exc))
    data["units"] = SERIES
    data["expected_ms"] = expected_ms().get(target, {})
    if named in RANGES:
        if len(cache) >= MAX_CACHED_SERIES:
            cache.clear()
        cache[key] = (time.time(), data)
    return jsonify(data)


OFFCPU_MAX_SECONDS = 86400
OFFCPU_MAX_POINTS = 120


@bp.get("/offcpu")
@gated("LIST_GATE")
def offcpu():
    """Off-CPU seconds per second by wait kind, from the stored kernel stacks; up to a day, as each bucket
    decompresses its windows' stacks, and within the read time budget: buckets past it are left out and the
    answer says so (`truncated`)."""
    store = require_store()
    target = request.args.get("target", "")
    if not store.windows(target=target, limit=1, with_profiles=False):
        abort(404, description=f"no stored windows for target {target!r}")
    raw = request.args.get("points", "60")
    if not (raw.isascii() and raw.isdigit()) or not 10 <= int(raw) <= OFFCPU_MAX_POINTS:
        abort(400, description=f"points must be an integer in 10..{OFFCPU_MAX_POINTS}, got {raw!r}")
    since, until = _range()
    if until - since > OFFCPU_MAX_SECONDS:
        abort(400, description="off-CPU by wait kind is read from stored kernel stacks: at most 24 hours at a time")
    interval = float(current_app.config.get("INTERVAL_SECONDS") or 5.0)
    step = max((until - since) / int(raw), interval)
    t: list[float] = []
    kinds: dict[str, list[float]] = {name: [] for name in WAIT_KINDS}
    start = since
    deadline = read_deadline()
    truncated = None
    while start < until:
        # The store reads every window overlapping the span; shrinking it by half an interval at both ends
        # counts each window once, in the bucket holding its midpoint. Kernel off-CPU stacks are kept in
        # microseconds (analysis.flamegraph.export.KINDS).
        read = None if time.monotonic() >= deadline else store.read_profiles(
            target, start + interval / 2, start + step - interval / 2, kind="offcpu",
            max_stacks=DEFAULT_LIMITS.max_stacks, deadline=deadline)
        if read is None or read.cut is not None:
            truncated = f"the time limit was hit: buckets from {start!r} on were not read"
            break
        # The detector's own classifier (analysis.waits): the page charts the kinds the causes are named from.
        split = by_kind(read.stacks)
        split["other"] += read.dropped_samples
        t.append(start)
        for name in kinds:
            kinds[name].append(float(f"{split[name] / 1e6 / step:.4g}"))
        start += step
    shown = {k: v for k, v in kinds.items() if any(v)}
    return jsonify({"target": target, "from": since, "to": until, "step": step, "t": t, "truncated": truncated,
                    "kinds": shown, "labels": {k: WAIT_LABELS[k] for k in shown}})
