"""One entry point from a profile (or a pair) to the bytes of any export format, with its MIME type."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .diff import diff, render_diff_svg
from .folded import format_diff_folded, format_folded
from .pprof import to_pprof
from .profile import Profile
from .speedscope import to_speedscope
from .svg import render_svg

FORMATS = ("folded", "svg", "speedscope", "pprof")
DIFF_FORMATS = ("svg", "folded", "json")
PROFILE_KINDS = ("active", "idle", "offcpu")


@dataclass(frozen=True)
class Exported:
    data: bytes
    mime: str
    extension: str


@dataclass(frozen=True)
class KindInfo:
    """How each profile kind is labelled in the formats that carry units."""

    unit: str
    sample_type: tuple[str, str]
    period_type: tuple[str, str]
    palette: str


KINDS: dict[str, KindInfo] = {
    "active": KindInfo("samples", ("samples", "count"), ("cpu", "nanoseconds"), "hot"),
    "idle": KindInfo("samples", ("samples", "count"), ("wall", "nanoseconds"), "io"),
    "offcpu": KindInfo("microseconds", ("off_cpu", "microseconds"), ("off_cpu", "microseconds"), "io"),
}


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


def export(profile: Profile, fmt: str, kind: str = "active", title: str = "Flame Graph",
           rate_hz: float | None = None) -> Exported:
    """`rate_hz` (py-spy's sampling rate) lets pprof carry time as well as sample counts."""
    _check(fmt, FORMATS, "format")
    _check(kind, PROFILE_KINDS, "profile kind")
    info = KINDS[kind]
    if fmt == "folded":
        return Exported(format_folded(profile).encode(), "text/plain; charset=utf-8", "folded")
    if fmt == "svg":
        return Exported(render_svg(profile, title=title, palette=info.palette).encode(), "image/svg+xml", "svg")
    if fmt == "speedscope":
        return Exported(json.dumps(to_speedscope(profile, name=title)).encode(), "application/json", "speedscope.json")
    period = int(1e9 / rate_hz) if (rate_hz and kind != "offcpu") else None
    data = to_pprof(profile, sample_type=info.sample_type, period=period, period_type=info.period_type)
    return Exported(data, "application/octet-stream", "pb.gz")


def export_diff(baseline: Profile, current: Profile, fmt: str, title: str = "Differential Flame Graph",
                top: int = 20) -> Exported:
    """svg: red grew, blue shrank, movers listed; folded: difffolded.pl input; json: the movers alone."""
    _check(fmt, DIFF_FORMATS, "diff format")
    if fmt == "folded":
        return Exported(format_diff_folded(baseline, current).encode(), "text/plain; charset=utf-8", "diff.folded")
    d = diff(baseline, current)
    if fmt == "svg":
        return Exported(render_diff_svg(d, title=title).encode(), "image/svg+xml", "diff.svg")
    movers = [{"function": m.name, "self_delta_pp": round(m.self_delta, 3), "total_delta_pp": round(m.total_delta, 3)}
              for m in d.movers(top)]
    body = {"baseline_samples": baseline.total(), "current_samples": current.total(), "movers": movers}
    return Exported(json.dumps(body).encode(), "application/json", "diff.json")
