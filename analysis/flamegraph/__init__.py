"""Flame graphs: a bounded profile model and its exports (folded, SVG, speedscope, pprof, differential)."""

from .diff import DiffProfile, Mover, diff, render_diff_svg
from .folded import (
    FoldedParseError,
    format_diff_folded,
    format_folded,
    parse_diff_folded,
    parse_folded,
)
from .pprof import to_pprof
from .profile import DEFAULT_LIMITS, TRUNCATED, Limits, Profile, Truncation, merge
from .speedscope import to_speedscope
from .svg import Style, render_svg

__all__ = [
    "DEFAULT_LIMITS", "TRUNCATED", "DiffProfile", "FoldedParseError", "Limits", "Mover", "Profile", "Style",
    "Truncation", "diff", "format_diff_folded", "format_folded", "merge", "parse_diff_folded", "parse_folded",
    "render_diff_svg", "render_svg", "to_pprof", "to_speedscope",
]
