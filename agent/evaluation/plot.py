"""`eval --plot`: per scenario, latency against the expected band, fault phases shaded and named, load steps marked,
regressions marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PHASE_COLOURS = {"gc": "#e6a23c", "lock": "#c45656", "blocked": "#8e6cbf", "syscalls": "#4c9f70",
                 "network": "#3d8bd9", "cpu_contention": "#d96b3d", "compute": "#a0a03c", "memory": "#8c5ad9", "unknown": "#999999"}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to get it."""


def plot_runs(runs: list[Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a server
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(f"--plot needs matplotlib ({exc}); pip install 'infersight[eval]'") from None
    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 3.4 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        _one(ax, run)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def episode_causes(run: Any) -> dict[str, str | None]:
    """Each episode's id -> the cause its mark names. An episode that found a fault phase: the cause it was scored
    on, as stored when the phase ended (the last windows of an episode that gave way to the next fault already rank
    that fault's cause). Any other: the cause as last ranked while it lasted (it is re-ranked while open)."""
    outcomes = run.outcomes
    scored = {next(e.id for e in run.score.episodes if e.phase == p.index): p.top_cause
              for p in run.score.phases if p.detected and p.top_cause}
    causes: dict[str, str | None] = {}
    for i, o in enumerate(outcomes):
        if o.opened is not None:
            causes[o.opened] = scored.get(o.opened) or next(
                (q.top_cause for q in reversed(outcomes[i:]) if q.regression == o.opened and q.top_cause), o.top_cause)
    return causes


def phase_marks(run: Any) -> list[tuple[float, float, str, str | None]]:
    """What the plot names above its phases, as (start and end in seconds from the first window, text, the fault
    label or None): every fault phase, and every normal phase that offers another load than the one before it."""
    outcomes = run.outcomes
    if not outcomes:
        return []
    t0 = outcomes[0].start
    # The load before each phase: the scenario's default before the first.
    rates = [run.scenario.rate, *(run.scenario.rate_of(phase) for phase in run.scenario.phases)]
    marks = []
    for p in run.score.phases:
        before, rate = rates[p.index], rates[p.index + 1]
        load = f"{rate:g} req/s" if rate != before else None
        fault = p.label if p.is_fault else None
        if fault or load:
            text = ", ".join(t for t in (fault, load) if t)
            marks.append((outcomes[p.first].start - t0, outcomes[p.last].end - t0, text, fault))
    return marks


def _one(ax: Any, run: Any) -> None:
    outcomes = run.outcomes
    if not outcomes:
        ax.set_title(f"{run.scenario.name}: no windows")
        return
    t0 = outcomes[0].start
    x = [(o.end - t0) for o in outcomes]

    def ms(v: float | None) -> float:
        return float("nan") if v is None else v * 1000

    # Each window's value holds from its start to its end: steps, with the first window's start prepended.
    xs = [0.0, *x]

    def steps(values: list[float]) -> list[float]:
        return [values[0], *values]

    ax.plot(xs, steps([ms(o.p99) for o in outcomes]), color="#222222", lw=1.2, drawstyle="steps-pre", label="p99")
    ax.plot(xs, steps([ms(o.p50) for o in outcomes]), color="#777777", lw=0.8, drawstyle="steps-pre", label="p50")
    lo = steps([ms(o.expected_p50) for o in outcomes])
    hi = steps([ms(o.expected_p99) for o in outcomes])
    ax.fill_between(xs, lo, hi, color="#4c9f70", alpha=0.25, step="pre", label="expected p50..p99")
    for start, end, text, fault in phase_marks(run):
        if fault:
            ax.axvspan(start, end, color=PHASE_COLOURS.get(fault, "#999999"), alpha=0.18)
        else:  # a benign load change: its bounds, so a latency that follows the load is read as such
            for edge in (start, end):
                ax.axvline(edge, color="#999999", lw=0.8, ls=":")
        # Inside the top of the plot, where the title above cannot cover it.
        ax.text((start + end) / 2, 0.98, text, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1})
    top = max((ms(o.p99) for o in outcomes if o.p99 is not None), default=1.0)
    causes = episode_causes(run)
    for i, o in enumerate(outcomes):
        if o.opened is None:
            continue
        cause = causes[o.opened]
        ax.axvline(x[i], color="#c0392b", lw=1, ls="--")
        ax.annotate(f"regression: {cause}", (x[i], top), rotation=90, fontsize=7, color="#c0392b",
                    ha="right", va="top")
    # A gap in the latency lines is either no request finished or no answer at all: say which.
    unanswered = [i for i, o in enumerate(outcomes) if o.unanswered]
    for i in unanswered:
        ax.axvspan(outcomes[i].start - t0, x[i], facecolor="none", hatch="///", edgecolor="#888888", lw=0,
                   label="no answer from the server" if i == unanswered[0] else None)
    warm = [x[i] for i, o in enumerate(outcomes) if o.warmup]
    if warm:
        ax.axvspan(0, max(warm), color="#dddddd", alpha=0.5, label="warm-up")
    ax.set_title(run.scenario.name, fontsize=10)
    ax.set_xlabel("seconds")
    ax.set_ylabel("latency (ms)")
    ax.legend(loc="upper left", fontsize=7)
