"""Flame graph trees in d3-flame-graph's JSON shape: one range, or a range against a baseline (differential)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, jsonify, request

from analysis.flamegraph.export import PROFILE_KINDS
from analysis.flamegraph.profile import Profile
from analysis.flamegraph.stored import from_store
from dashboards.errors import json_errors, require_store
from dashboards.limits import MAX_PROFILE_SPAN_SECONDS, gated, read_deadline
from dashboards.query import unix_seconds_arg

bp = Blueprint("flame", __name__, url_prefix="/api/flamegraph")
json_errors(bp, 400, 404, 503)

# Nodes below this share of the samples are folded into their parent: a browser draws a few thousand
# rectangles smoothly, not a hundred thousand.
MIN_SHARE = 1e-4


def tree(profile: Profile, baseline: Profile | None = None) -> dict[str, Any]:
    """{name, value, children[, delta]} from root-first stacks; with a baseline, `delta` is this node's
    self-samples minus the baseline's scaled to the same total (positive: it grew)."""
    root: dict[str, Any] = {"name": "all", "value": 0, "children": {}}
    for stack, count in profile.items():
        root["value"] += count
        node = root
        for frame in stack:
            node = node["children"].setdefault(frame, {"name": frame, "value": 0, "children": {}})
            node["value"] += count
    scale = 0.0
    base_self: dict[tuple[str, ...], float] = {}
    if baseline is not None and baseline.total():
        scale = profile.total() / baseline.total()
        for stack, count in baseline.items():
            base_self[tuple(stack)] = base_self.get(tuple(stack), 0.0) + count * scale
    floor = profile.total() * MIN_SHARE
    return _finish(root, (), floor, base_self if baseline is not None else None, profile)


def _finish(node: dict[str, Any], path: tuple[str, ...], floor: float, base_self: dict | None,
            profile: Profile) -> dict[str, Any]:
    kids = [_finish(c, path + (name,), floor, base_self, profile)
            for name, c in node["children"].items() if c["value"] >= floor]
    out: dict[str, Any] = {"name": node["name"], "value": node["value"], "children": kids}
    if base_self is not None:
        own = node["value"] - sum(c["value"] for c in node["children"].values())
        out["delta"] = round(own - base_self.get(path, 0.0)) if path else 0
    return out


@bp.get("/tree")
@gated("LIST_GATE")
def flame_tree():
    store = require_store()
    target = request.args.get("target", "")
    if not store.windows(target=target, limit=1, with_profiles=False):
        names = [t.name for t in store.targets()]
        abort(404, description=f"no stored profiles for target {target!r} (stored: {', '.join(names) or 'none yet'})")
    kind = request.args.get("kind", "active")
    if kind not in PROFILE_KINDS:
        abort(400, description=f"kind must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")
    diff = request.args.get("baseline_from") is not None or request.args.get("baseline_to") is not None
    since, until = unix_seconds_arg("from"), unix_seconds_arg("to")
    baseline_range = (unix_seconds_arg("baseline_from"), unix_seconds_arg("baseline_to")) if diff else None
    share = 0.5 if diff else 1.0
    try:
        current = from_store(store, target, since, until, kind, max_span=MAX_PROFILE_SPAN_SECONDS,
                             deadline=read_deadline(share))
        baseline = None if baseline_range is None else from_store(
            store, target, *baseline_range, kind, max_span=MAX_PROFILE_SPAN_SECONDS, deadline=read_deadline(share))
    except ValueError as exc:
        abort(400, description=str(exc))
    if baseline is not None and baseline.total() == 0:
        abort(404, description=f"no {kind} samples in the baseline range")
    cut = {name: {"from": p.start, "why": p.truncation.range_cut}
           for name, p in (("current", current), ("baseline", baseline)) if p is not None and p.truncation.range_cut}
    return jsonify({"target": target, "kind": kind, "unit": current.unit, "total": current.total(),
                    "baseline_total": baseline.total() if baseline is not None else None,
                    "truncated": current.truncation.any() or (baseline is not None and baseline.truncation.any()),
                    "range_cut": cut, "tree": tree(current, baseline)})
