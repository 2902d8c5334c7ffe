"""Differential flame graphs: baseline vs current, normalised by totals, red growth and blue shrinkage."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from .layout import Frame, layout
from .profile import Profile, Stack
from .svg import Style, render_layout, truncation_note

DIFF_STYLE = Style(width=1600, panel_width=420)


@dataclass(frozen=True)
class Mover:
    """One function's share of all samples, before and after, in percentage points."""

    name: str
    baseline_self: float
    current_self: float
    baseline_total: float
    current_total: float

    @property
    def self_delta(self) -> float:
        return self.current_self - self.baseline_self

    @property
    def total_delta(self) -> float:
        return self.current_total - self.baseline_total


@dataclass
class DiffProfile:
    """Two profiles lined up stack by stack, and every function's share in each."""

    baseline: Profile
    current: Profile
    # Union of both profiles' stacks, sorted: (stack, current count, baseline rescaled to the current total).
    stacks: list[tuple[Stack, int, float]] = field(default_factory=list)
    functions: list[Mover] = field(default_factory=list)

    def movers(self, top: int = 15, by: Literal["self", "total"] = "self") -> list[Mover]:
        """The functions whose share moved most; `by` 'self' (time in the function) or 'total' (with callees)."""
        if by not in ("self", "total"):
            raise ValueError(f"movers can be ranked by 'self' or 'total', got {by!r}")
        attr = "self_delta" if by == "self" else "total_delta"
        return sorted(self.functions, key=lambda m: (-abs(getattr(m, attr)), m.name))[:top]


def _shares(profile: Profile) -> tuple[dict[str, float], dict[str, float]]:
    """Each function's self and inclusive share, in percent of the profile's total."""
    total = profile.total()
    if not total:
        return {}, {}
    self_n: dict[str, int] = defaultdict(int)
    incl_n: dict[str, int] = defaultdict(int)
    for stack, count in profile.items():
        self_n[stack[-1]] += count
        # A recursive function counts once per stack, or its share could pass 100%.
        for name in set(stack):
            incl_n[name] += count
    scale = 100.0 / total
    return ({n: c * scale for n, c in self_n.items()}, {n: c * scale for n, c in incl_n.items()})


def diff(baseline: Profile, current: Profile) -> DiffProfile:
    """Compare two profiles by share of their own totals (difffolded.pl -n): a longer or busier
    current range does not read as growth everywhere."""
    if baseline.unit != current.unit:
        raise ValueError(f"cannot diff a profile in {baseline.unit!r} against one in {current.unit!r}")
    base_total, cur_total = baseline.total(), current.total()
    scale = cur_total / base_total if base_total else 0.0
    keys = sorted(set(baseline.stacks) | set(current.stacks))
    stacks = [(s, current.stacks.get(s, 0), baseline.stacks.get(s, 0) * scale) for s in keys]
    b_self, b_incl = _shares(baseline)
    c_self, c_incl = _shares(current)
    names = set(b_incl) | set(c_incl)
    movers = [Mover(n, b_self.get(n, 0.0), c_self.get(n, 0.0), b_incl.get(n, 0.0), c_incl.get(n, 0.0))
              for n in names]
    return DiffProfile(baseline=baseline, current=current, stacks=stacks, functions=movers)


def diff_color(delta: float, max_abs: float) -> str:
    """Red for growth, blue for shrinkage, paler as the change gets smaller (flamegraph.pl's scheme)."""
    if delta == 0 or max_abs <= 0:
        return "rgb(250,250,250)"
    fade = int(210 * (1 - min(abs(delta) / max_abs, 1.0)))
    return f"rgb(255,{fade},{fade})" if delta > 0 else f"rgb({fade},{fade},255)"


def _details(frame: Frame, total: int, unit: str) -> str:
    cur = 100.0 * frame.count / total if total else 0.0
    base = 100.0 * frame.base / total if total else 0.0
    self_delta = 100.0 * (frame.self_count - frame.base_self) / total if total else 0.0
    return (f"{frame.name} ({frame.count:,} {unit}, {cur:.2f}% now, {base:.2f}% before; "
            f"total {cur - base:+.2f} pp, self {self_delta:+.2f} pp)")


def render_diff_svg(d: DiffProfile, title: str = "Differential Flame Graph", *, subtitle: str | None = None,
                    top: int = 15, style: Style = DIFF_STYLE) -> str:
    """Widths from the current profile; colour from each frame's change in self share."""
    total = d.current.total()
    min_count = style.min_width * total / style.graph_width if total else 0.0
    lay = layout(d.stacks, min_count=min_count, max_frames=style.max_frames)
    max_abs = max((abs(f.self_count - f.base_self) for f in lay.frames), default=0.0)
    notes = [subtitle, (f"baseline {d.baseline.total():,} {d.baseline.unit}, current {total:,}; "
                       "red grew, blue shrank (share of samples)"),
             truncation_note(d.current, lay.elided), truncation_note(d.baseline, 0)]
    panel = [f"{m.self_delta:+7.2f} {m.total_delta:+7.2f}  {_short(m.name)}" for m in d.movers(top)]
    return render_layout(lay, title=title, subtitle="; ".join(n for n in notes if n), unit=d.current.unit,
                         style=style, color=lambda f: diff_color(f.self_count - f.base_self, max_abs),
                         details=lambda f: _details(f, total, d.current.unit),
                         panel=["   self   total  (pp)"] + panel, panel_title="Largest movers")


def _short(name: str, room: int = 44) -> str:
    return name if len(name) <= room else name[: room - 2] + ".."
