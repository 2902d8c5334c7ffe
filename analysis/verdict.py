"""What a detector answers for each window (Verdict) and what the agent needs of one (Detector): no model imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from analysis.regression import Regression
from analysis.window import Window


@dataclass(frozen=True)
class Verdict:
    """The detector's answer for one window."""

    state: str  # "warmup" | "healthy" | "regression"
    score: float | None
    expected: dict[str, float]
    regression: Regression | None
    opened: Regression | None
    closed: Regression | None


class Detector(Protocol):
    """One per target: windows in time order, an end when its process ends, state that survives a restart.
    analysis.detector.LatencyDetector is the one the agent runs; scoring and tests plug in others."""

    def update(self, window: Window) -> Verdict: ...

    def interrupt(self, at: float) -> Regression | None: ...

    def get_state(self) -> dict: ...

    def set_state(self, state: dict) -> None: ...

    def reset(self) -> None: ...
