"""Standalone interactive SVG flame graphs (hover, click to zoom, search), readable offline."""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from .layout import Frame, Layout, layout
from .profile import TRUNCATED, UNKNOWN, Profile
from .svg_script import SCRIPT

_XML_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})
# What XML 1.0 forbids (no escape makes it legal) and what reorders text (bidi controls): shown as \xNN / \uNNNN
# text instead. Frame names arrive already clean (profile.clean_frame); titles and panel lines may not.
_XML_UNSAFE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                         r"\ud800-\udfff\ufffe\uffff]")

PALETTES = ("hot", "mem", "io")


def xml_escape(text: str) -> str:
    """Escape for XML/HTML text and quoted attributes; any str gives well-formed XML."""
    if _XML_UNSAFE.search(text):
        text = _XML_UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                               else f"\\u{ord(m.group()):04x}", text)
    return text.translate(_XML_ESCAPES)


@dataclass(frozen=True)
class Style:
    """Geometry of the drawing, flamegraph.pl's defaults."""

    width: int = 1200
    frame_height: int = 16
    font_size: float = 12.0
    font_width: float = 0.59
    min_width: float = 0.1
    max_frames: int = 50_000
    panel_width: int = 0

    def __post_init__(self) -> None:
        if not 200 <= self.width <= 100_000:
            raise ValueError(f"width must be within [200, 100000] px, got {self.width!r}")
        if not 0.0 <= self.min_width <= self.width:
            raise ValueError(f"min_width must be within [0, width] px, got {self.min_width!r}")
        if self.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {self.max_frames!r}")
        if not 0 <= self.panel_width <= self.width - 100:
            raise ValueError(f"panel_width must leave at least 100 px of graph, got {self.panel_width!r}")
        if not 8 <= self.frame_height <= 100:
            raise ValueError(f"frame_height must be within [8, 100] px, got {self.frame_height!r}")

    @property
    def xpad(self) -> float:
        return 10.0

    @property
    def top(self) -> float:
        return self.font_size * 3

    @property
    def bottom(self) -> float:
        return self.font_size * 2 + 10

    @property
    def graph_width(self) -> float:
        return self.width - 2 * self.xpad - self.panel_width


def _unit_hash(name: str, salt: bytes) -> float:
    return zlib.crc32(salt + name.encode("utf-8", "surrogatepass")) / 0xFFFFFFFF


def palette_color(name: str, palette: str = "hot") -> str:
    """flamegraph.pl-like colours, hashed from the name so a function keeps its colour across graphs."""
    if name in (TRUNCATED, UNKNOWN):
        return "rgb(190,190,190)"
    v1, v2, v3 = _unit_hash(name, b"1"), _unit_hash(name, b"2"), _unit_hash(name, b"3")
    if name.endswith("_[k]"):
        return f"rgb({200 + int(55 * v1)},{140 + int(60 * v2)},{int(40 * v3)})"
    if palette == "hot":
        return f"rgb({205 + int(50 * v3)},{int(230 * v1)},{int(55 * v2)})"
    if palette == "mem":
        return f"rgb(0,{190 + int(50 * v2)},{int(210 * v1)})"
    if palette == "io":
        return f"rgb({80 + int(60 * v1)},{80 + int(60 * v1)},{190 + int(55 * v2)})"
    raise ValueError(f"unknown palette {palette!r}; expected one of {PALETTES}")


def fit_label(name: str, width_px: float, style: Style) -> str:
    room = int((width_px - 6) // (style.font_size * style.font_width))
    if room < 3:
        return ""
    return name if len(name) <= room else name[: room - 2] + ".."


def _pct(part: float, total: float) -> str:
    return f"{100.0 * part / total:.2f}%" if total else "0.00%"


def default_details(frame: Frame, total: int, unit: str) -> str:
    return f"{frame.name} ({frame.count:,} {unit}, {_pct(frame.count, total)})"


def render_layout(lay: Layout, *, title: str, subtitle: str | None, unit: str, style: Style,
                  color: Callable[[Frame], str], details: Callable[[Frame], str],
                  panel: list[str] | None = None, panel_title: str = "") -> str:
    """The SVG text for positioned frames; `panel` lines are drawn in a column right of the graph."""
    height = int((lay.max_depth + 1) * style.frame_height + style.top + style.bottom
                 + (style.font_size * 1.5 if subtitle else 0))
    if panel:
        height = max(height, int(style.top + (len(panel) + 2) * style.font_size * 1.4))
    per_unit = style.graph_width / lay.total if lay.total else 0.0
    fs = style.font_size
    out: list[str] = [
        '<?xml version="1.0" standalone="no"?>\n',
        '<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">\n',
        (f'<svg version="1.1" width="{style.width}" height="{height}" onload="init(evt)" '
        f'viewBox="0 0 {style.width} {height}" xmlns="http://www.w3.org/2000/svg" '
        f'xmlns:xlink="http://www.w3.org/1999/xlink" data-fontsize="{fs}" '
        f'data-fontwidth="{style.font_width}" data-xpad="{style.xpad}" data-panel="{style.panel_width}">\n'),
        ("<defs><linearGradient id=\"background\" y1=\"0\" y2=\"1\" x1=\"0\" x2=\"0\">"
        "<stop stop-color=\"#eeeeee\" offset=\"5%\"/><stop stop-color=\"#eeeeb0\" offset=\"95%\"/>"
        "</linearGradient></defs>\n"),
        (f"<style type=\"text/css\">text {{ font-family: Verdana, sans-serif; font-size: {fs}px; fill: rgb(0,0,0); }}"
        " #title { text-anchor: middle; font-size: 17px; } #subtitle { text-anchor: middle; }"
        " #frames > g { cursor: pointer; } #frames > g:hover > rect { stroke: black; stroke-width: 0.5; }"
        " #frames text { pointer-events: none; } .hide { display: none; } .parent { opacity: 0.5; }"
        " #search, #unzoom, #matched { cursor: pointer; } #search.show { fill: rgb(230,0,230); }"
        " #panel text { font-family: monospace; }</style>\n"),
        f"<script type=\"text/ecmascript\"><![CDATA[{SCRIPT}]]></script>\n",
        f'<rect x="0" y="0" width="{style.width}" height="{height}" fill="url(#background)"/>\n',
        (f'<text id="title" x="{(style.width - style.panel_width) / 2:.1f}" y="{fs * 2:.1f}">'
        f"{xml_escape(title)}</text>\n"),
    ]
    if subtitle:
        out.append(f'<text id="subtitle" x="{(style.width - style.panel_width) / 2:.1f}" y="{fs * 3.3:.1f}">'
                   f"{xml_escape(subtitle)}</text>\n")
    out += [
        f'<text id="details" x="{style.xpad}" y="{height - fs:.1f}"> </text>\n',
        f'<text id="unzoom" class="hide" x="{style.xpad}" y="{fs * 2:.1f}">Reset Zoom</text>\n',
        f'<text id="search" x="{style.width - style.panel_width - style.xpad - 100}" y="{fs * 2:.1f}">Search</text>\n',
        (f'<text id="matched" class="hide" x="{style.width - style.panel_width - style.xpad - 100}" '
        f'y="{height - fs:.1f}"> </text>\n'),
        '<g id="frames">\n',
    ]
    base_y = height - style.bottom
    for frame in lay.frames:
        x = style.xpad + frame.start * per_unit
        w = frame.count * per_unit
        y = base_y - (frame.depth + 1) * style.frame_height + 1
        out.append(
            f'<g><title>{xml_escape(details(frame))}</title>'
            f'<rect x="{x:.2f}" y="{y:.1f}" width="{w:.2f}" height="{style.frame_height - 1}" '
            f'fill="{color(frame)}" rx="2" ry="2"/>'
            f'<text x="{x + 3:.2f}" y="{y + style.frame_height / 2 + fs / 3:.1f}">'
            f"{xml_escape(fit_label(frame.name, w, style))}</text></g>\n")
    out.append("</g>\n")
    if panel:
        px = style.width - style.panel_width + 5
        out.append(f'<g id="panel"><text x="{px}" y="{fs * 4:.1f}" font-weight="bold">'
                   f"{xml_escape(panel_title)}</text>\n")
        for i, line in enumerate(panel):
            out.append(f'<text x="{px}" y="{fs * (5.5 + 1.4 * i):.1f}" xml:space="preserve">'
                       f"{xml_escape(line)}</text>\n")
        out.append("</g>\n")
    out.append("</svg>\n")
    return "".join(out)


def truncation_note(profile: Profile, elided: int) -> str | None:
    t = profile.truncation
    parts = []
    if elided:
        parts.append(f"{elided:,} frames narrower than the minimum width merged away with their callees")
    if t.dropped_stacks or t.dropped_frames:
        parts.append(f"limits hit: {t.dropped_stacks:,} stacks ({t.dropped_samples:,} {profile.unit}) and "
                     f"{t.dropped_frames:,} frame names put under {TRUNCATED}")
    if t.long_frames or t.deep_stacks:
        parts.append(f"{t.long_frames:,} long names shortened, {t.deep_stacks:,} deep stacks cut")
    if t.range_cut:
        since = f" from {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(profile.start))}" if profile.start else ""
        parts.append(f"{t.range_cut} hit: only the newest part of the range was read{since}")
    return "; ".join(parts) or None


def render_svg(profile: Profile, title: str = "Flame Graph", *, subtitle: str | None = None,
               palette: str = "hot", style: Style = Style()) -> str:
    """A profile as a standalone interactive SVG flame graph."""
    if palette not in PALETTES:
        raise ValueError(f"unknown palette {palette!r}; expected one of {PALETTES}")
    lay = layout([(s, c, 0.0) for s, c in profile.sorted_items()],
                 min_count=_min_count(profile.total(), style), max_frames=style.max_frames)
    note = truncation_note(profile, lay.elided)
    sub = "; ".join(p for p in (subtitle, note) if p) or None
    return render_layout(lay, title=title, subtitle=sub, unit=profile.unit, style=style,
                         color=lambda f: palette_color(f.name, palette),
                         details=lambda f: default_details(f, lay.total, profile.unit))


def _min_count(total: int, style: Style) -> float:
    return style.min_width * total / style.graph_width if total else 0.0
