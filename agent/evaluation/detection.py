"""Run a detector over labelled windows in time order and keep what scoring and plots need of each verdict."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from agent.evaluation.recording import LabelledWindow
from analysis.change_cause import ChangeNote, attribute_change
from analysis.regression import Regression
from analysis.scoring import Outcome
from analysis.verdict import Detector, Verdict

DetectorFactory = Callable[[], Detector]


def default_detector_factory() -> DetectorFactory:
    """The real detector, imported when a run needs it (scoring and recordings alone do not load scikit-learn)."""
    from analysis.detector import LatencyDetector

    return LatencyDetector


class Tracker:
    """One detector for one scenario run; feed() one window at a time, in time order. A change a window carries
    (the server restarted with other arguments) labels the regressions after it as the daemon's detection layer does
    (analysis.change_cause): the detector itself ranks measured signals only."""

    def __init__(self, factory: DetectorFactory) -> None:
        self.detector = factory()
        self.last: Verdict | None = None
        self.change: ChangeNote | None = None

    def feed(self, item: LabelledWindow) -> Outcome:
        if item.change is not None:
            self.change = change_note(item.change)
        verdict = self._with_change(self.detector.update(item.window))
        self.last = verdict
        # The regression this window belongs to: the open one, else the one that closed on it.
        current = verdict.regression or verdict.closed
        w = item.window
        p50 = w.latency.p50_seconds if w.latency else None
        p99 = w.latency.p99_seconds if w.latency else None
        return Outcome(start=w.start, end=w.end, label=item.label, phase=item.phase,
                       warmup=verdict.state == "warmup", state=verdict.state,
                       regression=current.id if current is not None else None,
                       top_cause=current.top_cause if current is not None else None,
                       opened=verdict.opened.id if verdict.opened is not None else None,
                       score=_number(verdict.score), p50=p50, p99=p99,
                       expected_p50=_number((verdict.expected or {}).get("p50")),
                       expected_p99=_number((verdict.expected or {}).get("p99")),
                       unanswered="latency" in w.unanswered, culprit=item.culprit,
                       top_neighbour=_top_neighbour(current))


    def _with_change(self, verdict: Verdict) -> Verdict:
        if self.change is None:
            return verdict
        change = self.change

        def label(r: Regression | None) -> Regression | None:
            return None if r is None else attribute_change(r, change)
        return dataclasses.replace(verdict, regression=label(verdict.regression), opened=label(verdict.opened),
                                   closed=label(verdict.closed))


def change_note(stored: dict[str, Any]) -> ChangeNote:
    """A recorded change (StoredChange.to_dict()) as the daemon hands it to the `change` cause."""
    from agent.changes import note
    from agent.store.changes import StoredChange

    return note(StoredChange(**stored))


def detect(factory: DetectorFactory, windows: Iterable[LabelledWindow]) -> list[Outcome]:
    """A fresh detector over `windows`, as a replay does it."""
    tracker = Tracker(factory)
    return [tracker.feed(item) for item in windows]


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _top_neighbour(regression: Any) -> int | None:
    """The pid the regression's top cause names first as its culprit: the neighbour that held the CPU
    (analysis.culprits), else the process that grew most in memory (analysis.memory_growers), else the process that
    wrote most while the I/O stalled (analysis.disk_writers)."""
    if regression is None or not regression.causes:
        return None
    top = regression.causes[0]
    if top.neighbours:
        return top.neighbours[0].pid
    if top.growers:
        return top.growers[0].pid
    return top.writers[0].pid if top.writers else None
