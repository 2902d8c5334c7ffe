"""Score a detector against labelled phases by episodes: detection, delay, false alarms, attribution."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

NORMAL = "normal"
# An episode opening this many windows after a fault phase's last window still counts for that phase.
TAIL_WINDOWS = 2


@dataclass(frozen=True)
class Outcome:
    """One window as scoring sees it: its label from the schedule and what the detector said on it."""

    start: float
    end: float
    label: str
    phase: int | None
    warmup: bool
    state: str = "healthy"
    # The regression open on this window (or closed on it), its top cause as stored now, and the id
    # of a regression that opened on this very window.
    regression: str | None = None
    top_cause: str | None = None
    opened: str | None = None
    score: float | None = None
    p50: float | None = None
    p99: float | None = None
    expected_p50: float | None = None
    expected_p99: float | None = None
    # The server's latency endpoint did not answer in this window (Window.unanswered).
    unanswered: bool = False
    # The culprit pid the scenario recorded for this window's phase (a tuple of pids where its fault started
    # several processes of one job), and the neighbour pid the regression's top cause named first
    # (analysis.culprits); None where there is none.
    culprit: int | tuple[int, ...] | None = None
    top_neighbour: int | None = None


@dataclass(frozen=True)
class PhaseResult:
    index: int
    label: str
    first: int
    last: int
    scored: bool
    detected: bool = False
    delay_windows: int | None = None
    delay_seconds: float | None = None
    top_cause: str | None = None
    culprit: int | tuple[int, ...] | None = None  # recorded by the scenario for this phase
    named: int | None = None  # the neighbour the detector named first at the phase's end

    @property
    def culprit_named(self) -> bool:
        """The neighbour named first is the recorded culprit (one of them, where the fault started several)."""
        if self.named is None or self.culprit is None:
            return False
        return self.named in self.culprit if isinstance(self.culprit, tuple) else self.named == self.culprit

    @property
    def is_fault(self) -> bool:
        return self.label != NORMAL

    @property
    def attributed(self) -> bool:
        return self.detected and self.top_cause == self.label


@dataclass(frozen=True)
class Episode:
    id: str
    window: int
    phase: int | None  # the fault phase it matches; None: a false alarm


@dataclass
class RunScore:
    """One scenario run."""

    name: str
    phases: list[PhaseResult] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    windows_scored: int = 0
    normal_seconds: float = 0.0

    @property
    def fault_phases(self) -> list[PhaseResult]:
        return [p for p in self.phases if p.is_fault and p.scored]


def _phases(outcomes: list[Outcome]) -> list[tuple[int, str, int, int]]:
    """(phase index, label, first window, last window) in order; windows outside the schedule belong to none."""
    out: list[tuple[int, str, int, int]] = []
    for i, o in enumerate(outcomes):
        if o.phase is None:
            continue
        if out and out[-1][0] == o.phase and out[-1][3] == i - 1:
            index, label, first, _ = out[-1]
            out[-1] = (index, label, first, i)
        else:
            out.append((o.phase, o.label, i, i))
    return out


def score_run(name: str, outcomes: list[Outcome]) -> RunScore:
    """Episodes against phases, as issue 11 defines them (docs/evaluation.md)."""
    run = RunScore(name=name)
    spans = _phases(outcomes)
    # A fault phase whose first window is still in the warm-up is not scored: the detector was not armed.
    fault_spans = [s for s in spans if s[1] != NORMAL and not outcomes[s[2]].warmup]
    for i, o in enumerate(outcomes):
        if o.warmup:
            continue
        run.windows_scored += 1
        if o.label == NORMAL:
            run.normal_seconds += max(0.0, o.end - o.start)
        if o.opened is not None:
            run.episodes.append(Episode(id=o.opened, window=i, phase=_match(i, fault_spans)))
    for index, label, first, last in spans:
        scored = not outcomes[first].warmup
        if label == NORMAL or not scored:
            run.phases.append(PhaseResult(index, label, first, last, scored))
            continue
        mine = [e for e in run.episodes if e.phase == index]
        if not mine:
            run.phases.append(PhaseResult(index, label, first, last, scored))
            continue
        e = mine[0]
        cause = _cause_at_phase_end(outcomes, e, last)
        culprit = next((o.culprit for o in outcomes[first:last + 1] if o.culprit is not None), None)
        named = next((outcomes[j].top_neighbour for j in range(max(e.window, last), e.window - 1, -1)
                      if outcomes[j].regression == e.id), None)
        run.phases.append(PhaseResult(index, label, first, last, scored, detected=True, delay_windows=e.window - first,
                                      delay_seconds=outcomes[e.window].end - outcomes[first].start, top_cause=cause,
                                      culprit=culprit, named=named))
    return run


def _match(i: int, fault_spans: list[tuple[int, str, int, int]]) -> int | None:
    for index, _, first, last in fault_spans:
        if first <= i <= last:
            return index
    for index, _, first, last in fault_spans:
        if last < i <= last + TAIL_WINDOWS:
            return index
    return None


def _cause_at_phase_end(outcomes: list[Outcome], episode: Episode, last: int) -> str | None:
    """The episode's top cause on the phase's last window (or where it closed, or opened in the tail)."""
    cause = None
    for j in range(episode.window, max(episode.window, last) + 1):
        if outcomes[j].regression == episode.id:
            cause = outcomes[j].top_cause
    return cause


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _counts(phases: list[PhaseResult]) -> dict[str, Any]:
    detected = [p for p in phases if p.detected]
    return {"phases": len(phases), "detected": len(detected), "attributed": sum(p.attributed for p in phases),
            "median_delay_windows": _median([float(p.delay_windows) for p in detected if p.delay_windows is not None])}


def summarize(runs: list[RunScore]) -> dict[str, Any]:
    """The benchmark's figures over every run, per cause label and per scenario (the `--json` object)."""
    faults = [p for r in runs for p in r.fault_phases]
    detected = [p for p in faults if p.detected]
    episodes = [e for r in runs for e in r.episodes]
    false_alarms = sum(e.phase is None for e in episodes)
    normal_hours = sum(r.normal_seconds for r in runs) / 3600.0
    labels = sorted({p.label for p in faults})
    scenarios: dict[str, Any] = {}
    for r in runs:
        key = r.name if r.name not in scenarios else f"{r.name} #{sum(k.startswith(r.name) for k in scenarios) + 1}"
        s_eps = r.episodes
        s_fa = sum(e.phase is None for e in s_eps)
        scenarios[key] = {**_counts(r.fault_phases),
                          "precision": _ratio(len(s_eps) - s_fa, len(s_eps)),
                          "recall": _ratio(sum(p.detected for p in r.fault_phases), len(r.fault_phases)),
                          "episodes": len(s_eps), "false_alarms": s_fa, "windows_scored": r.windows_scored}
    return {
        "precision": _ratio(len(episodes) - false_alarms, len(episodes)),
        "recall": _ratio(len(detected), len(faults)),
        # Over detected phases: a missed phase counts against recall, not twice.
        "attribution_top1": _ratio(sum(p.attributed for p in detected), len(detected)),
        # Over detected phases whose scenario recorded a culprit pid: the neighbour named first is that process.
        # None (not measured) where no phase records one (every recording before issue 34).
        "culprit_top1": _ratio(sum(p.culprit_named for p in detected if p.culprit is not None),
                               sum(p.culprit is not None for p in detected)),
        "median_delay_windows": _median([float(p.delay_windows) for p in detected if p.delay_windows is not None]),
        "median_delay_seconds": _median([p.delay_seconds for p in detected if p.delay_seconds is not None]),
        "false_alarms": false_alarms,
        "false_alarms_per_hour": false_alarms / normal_hours if normal_hours > 0 else None,
        "normal_hours": normal_hours,
        "episodes": len(episodes),
        "fault_phases": len(faults),
        "windows_scored": sum(r.windows_scored for r in runs),
        "per_label": {label: _counts([p for p in faults if p.label == label]) for label in labels},
        "scenarios": scenarios,
    }
