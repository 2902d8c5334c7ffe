"""A small stand-in detector with the real one's interface, so the eval runner is tested without it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from analysis.regression import Cause, Regression
from analysis.window import Window


@dataclass
class Verdict:
    state: str
    score: float | None = None
    expected: dict[str, float] = field(default_factory=dict)
    regression: Regression | None = None
    opened: Regression | None = None
    closed: Regression | None = None


def _signals(w: Window) -> dict[str, float]:
    d = max(w.duration, 1e-9)
    return {"gc": (w.gc.pause_seconds if w.gc else 0.0) / d,
            "blocked": (w.offcpu.seconds if w.offcpu else 0.0) / d,
            "syscalls": (sum(w.syscalls.counts.values()) if w.syscalls else 0) / d}


class ThresholdDetector:
    """Warm-up of `warmup` windows, then a regression while mean latency exceeds `factor` x the warm-up median.

    The top cause is the signal that grew most against its warm-up median.
    """

    def __init__(self, warmup: int = 3, factor: float = 2.0) -> None:
        self.warmup, self.factor = warmup, factor
        self._seen: list[Window] = []
        self._open: Regression | None = None
        self._count = 0

    def update(self, window: Window) -> Verdict:
        mean = window.latency.mean_seconds if window.latency else None
        if len(self._seen) < self.warmup:
            self._seen.append(window)
            return Verdict("warmup")
        base = statistics.median(w.latency.mean_seconds or 0.0 for w in self._seen if w.latency)
        p99 = statistics.median(w.latency.p99_seconds or 0.0 for w in self._seen if w.latency)
        score = (mean or 0.0) / base if base else 0.0
        expected = {"p50": base, "p99": p99}
        if self._open is None and score > self.factor:
            self._count += 1
            self._open = Regression(id=f"t{self._count}", target=window.target, pid=window.pid,
                                    opened_at=window.end, severity="warning", score=score, causes=self._causes(window))
            return Verdict("regression", score, expected, self._open, opened=self._open)
        if self._open is not None and score <= self.factor:
            closed, self._open = self._open, None
            closed.closed_at = window.end
            return Verdict("healthy", score, expected, None, closed=closed)
        if self._open is not None:
            self._open.causes = self._causes(window)
            return Verdict("regression", score, expected, self._open)
        return Verdict("healthy", score, expected)

    def _causes(self, window: Window) -> list[Cause]:
        now = _signals(window)
        base = {k: statistics.median(_signals(w)[k] for w in self._seen) for k in now}
        ratio = {k: now[k] / base[k] if base[k] else (float("inf") if now[k] else 0.0) for k in now}
        ranked = sorted(ratio, key=lambda k: ratio[k], reverse=True)
        return [Cause(label=k, score=min(ratio[k], 1e9), evidence=f"{k} x{ratio[k]:.1f}") for k in ranked]
