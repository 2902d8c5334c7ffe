"""Small inline SVG line charts (no JavaScript, no network): series against a numeric x, with markers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")
WIDTH, HEIGHT = 460, 250
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 30, 42


@dataclass
class Series:
    label: str
    points: list[tuple[float, float | None]]  # (x, y); y None = not measured at that x
    hollow: list[tuple[float, float]] = field(default_factory=list)  # extra points drawn unfilled (repeats)


@dataclass
class Marker:
    """A vertical line at x (the knee) or, with horizontal=True, a line at y (the SLO)."""

    at: float
    label: str
    color: str
    horizontal: bool = False


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:.3g}"


def line_chart(chart_id: str, title: str, x_label: str, y_label: str, series: list[Series],
               markers: list[Marker] | None = None, empty_reason: str = "not measured") -> str:
    """One chart as an <svg>; a chart with no measured point says why instead of drawing axes alone."""
    markers = markers or []
    xs = [x for s in series for x, _ in s.points] + [m.at for m in markers if not m.horizontal]
    ys = [y for s in series for _, y in s.points if y is not None] + [y for s in series for _, y in s.hollow]
    ys += [m.at for m in markers if m.horizontal]
    head = (f'<svg class="chart" id="{escape(chart_id)}" data-points="{len([y for y in ys if y is not None])}" '
            f'xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'role="img" aria-label="{escape(title)}">'
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff" stroke="#ddd"/>'
            f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>')
    if not xs or not [s for s in series if any(y is not None for _, y in s.points)]:
        return (head + f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="12" '
                f'fill="#888">{escape(empty_reason)}</text></svg>')
    span = (max(xs) - min(xs)) or max(abs(max(xs)), 1.0)
    x0, x1 = min(xs) - 0.08 * span, max(xs) + 0.08 * span  # room for the end points and marker labels
    y1 = _nice_max(max(ys) if ys else 1.0)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1.0) * pw

    def py(y: float) -> float:
        return TOP + ph - (y / y1) * ph

    parts = [head, '<g font-size="10" fill="#444">']
    for i in range(5):
        yv = y1 * i / 4
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(yv):.1f}" y2="{py(yv):.1f}" stroke="#eee"/>'
                     f'<text x="{LEFT - 4}" y="{py(yv) + 3:.1f}" text-anchor="end">{_fmt(yv)}</text>')
    ticks = sorted({x for s in series for x, _ in s.points})
    for xv in ticks[:: max(1, len(ticks) // 8)]:
        parts.append(f'<text x="{px(xv):.1f}" y="{TOP + ph + 14}" text-anchor="middle">{_fmt(xv)}</text>')
    parts.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{TOP + ph}" y2="{TOP + ph}" stroke="#888"/>'
                 f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}" stroke="#888"/>'
                 f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>'
                 f'<text x="12" y="{TOP + ph / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {TOP + ph / 2})">{escape(y_label)}</text></g>')
    for m in markers:
        if m.horizontal:
            parts.append(f'<line class="marker" x1="{LEFT}" x2="{LEFT + pw}" y1="{py(m.at):.1f}" y2="{py(m.at):.1f}" '
                         f'stroke="{m.color}" stroke-dasharray="5,3"/><text x="{LEFT + pw - 2}" y="{py(m.at) - 3:.1f}" '
                         f'text-anchor="end" font-size="10" fill="{m.color}">{escape(m.label)}</text>')
        else:
            right = px(m.at) > LEFT + pw * 0.75  # a label near the right edge goes left of its line
            parts.append(f'<line class="marker" x1="{px(m.at):.1f}" x2="{px(m.at):.1f}" y1="{TOP}" y2="{TOP + ph}" '
                         f'stroke="{m.color}" stroke-dasharray="5,3"/><text x="{px(m.at) + (-3 if right else 3):.1f}" '
                         f'y="{TOP + 10}" text-anchor="{"end" if right else "start"}" font-size="10" '
                         f'fill="{m.color}">{escape(m.label)}</text>')
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        pts = [(px(x), py(y)) for x, y in sorted(s.points) if y is not None]
        if len(pts) > 1:
            path = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
            parts.append(f'<polyline class="series" points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts += [f'<circle class="point" cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>' for a, b in pts]
        parts += [f'<circle class="point repeat" cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="none" stroke="{color}"/>'
                  for x, y in s.hollow]
        if len(series) > 1 or s.label:
            parts.append(f'<text x="{LEFT + 6}" y="{TOP + 12 + 12 * i}" font-size="10" fill="{color}">'
                         f'{escape(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
