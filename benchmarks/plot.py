"""Line charts of a soak's readings: an SVG drawn here, a PNG rendered from it by headless chromium."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html import escape
from pathlib import Path

PANEL_W, PANEL_H, COLUMNS = 460, 220, 2
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 64, 16, 30, 34


def _panel(x0: float, y0: float, title: str, points: list[tuple[float, float]]) -> list[str]:
    out = [f'<text x="{x0 + MARGIN_L}" y="{y0 + 20}" font-size="14" font-weight="bold">{escape(title)}</text>']
    left, top = x0 + MARGIN_L, y0 + MARGIN_T
    w, h = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
    if not points:
        out.append(f'<text x="{left + 10}" y="{top + h / 2}" font-size="12">no readings</text>')
        return out
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y_lo, y_hi = min(0.0, min(ys)), max(ys) * 1.1 if max(ys) > 0 else 1.0
    coords = " ".join(f"{left + (x - x_lo) / (x_hi - x_lo) * w:.1f},{top + h - (y - y_lo) / (y_hi - y_lo) * h:.1f}"
                      for x, y in points)
    out.append(f'<polyline points="{coords}" fill="none" stroke="#c0392b" stroke-width="1.8"/>')
    for value, y in ((y_hi, top + 4), (y_lo, top + h)):
        out.append(f'<text x="{left - 6}" y="{y + 4}" font-size="11" text-anchor="end">{value:.4g}</text>')
    for value, anchor, x in ((x_lo, "start", left), (x_hi, "end", left + w)):
        out.append(f'<text x="{x}" y="{top + h + 16}" font-size="11" text-anchor="{anchor}">{value / 60:.1f} min</text>')
    return out


def svg(title: str, panels: dict[str, list[tuple[float, float]]]) -> str:
    rows = (len(panels) + COLUMNS - 1) // COLUMNS
    width, height = COLUMNS * PANEL_W, rows * PANEL_H + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="12" y="26" font-size="16" font-weight="bold">{escape(title)}</text>']
    for i, (name, points) in enumerate(panels.items()):
        parts += _panel((i % COLUMNS) * PANEL_W, 40 + (i // COLUMNS) * PANEL_H, name, points)
    parts.append("</svg>")
    return "\n".join(parts)


def size(panels: int) -> tuple[int, int]:
    return COLUMNS * PANEL_W, ((panels + COLUMNS - 1) // COLUMNS) * PANEL_H + 40


def render_png(svg_text: str, png: Path, width: int, height: int, timeout: float = 60.0) -> str | None:
    """Write `png` from the SVG with headless chromium; None when done, else why not (one line)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return "chromium is not installed ('make setup' installs Debian's chromium)"
    with tempfile.TemporaryDirectory(prefix="infersight-plot-") as tmp:
        page = Path(tmp) / "plot.svg"
        page.write_text(svg_text)
        try:
            done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                   f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}",
                                   f"--screenshot={png.resolve()}", page.as_uri()],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"chromium did not finish within {timeout:.0f} s"
    if done.returncode != 0 or not png.exists():
        return f"chromium exited with {done.returncode}: {done.stderr.strip().splitlines()[-1:] or 'no message'}"
    return None
