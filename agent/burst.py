"""When stack sampling should run at full rate: a regression is open, or the detector's score is climbing."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol


class Finding(Protocol):
    state: str
    score: float | None
    window_end: float


class Snapshot(Protocol):
    findings: dict[str, Finding]


class BurstPolicy:
    """`wants_burst(target)` for the stack sampler, from the detector's latest findings.

    True while the target's regression is open, and when its score rose `rising_windows` windows
    running to above every score of the `history` windows before them: a new high that keeps
    climbing, so the burst starts before the detector opens the episode and its flame graph has the
    onset. Scale-free on purpose: the detector's score has no fixed unit.
    """

    def __init__(self, snapshot: Callable[[], Snapshot], rising_windows: int = 2, history: int = 60) -> None:
        if rising_windows < 1:
            raise ValueError(f"rising_windows must be >= 1, got {rising_windows!r}")
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history!r}")
        self.rising_windows = rising_windows
        self.history = history
        self._snapshot = snapshot
        self._scores: dict[str, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def forget(self, target: str) -> None:
        """The target is no longer watched: its score history goes (a regex target gets a name per process)."""
        with self._lock:
            self._scores.pop(target, None)

    def wants_burst(self, target: str) -> bool:
        finding = self._snapshot().findings.get(target)
        if finding is None:
            return False
        if finding.state == "regression":
            return True
        if finding.score is None or finding.state == "warmup":
            return False
        with self._lock:
            seen = self._scores.setdefault(target, deque(maxlen=self.history + self.rising_windows))
            if not seen or seen[-1][0] != finding.window_end:
                seen.append((finding.window_end, finding.score))
            scores = [s for _, s in seen]
        k = self.rising_windows
        if len(scores) <= k:
            return False
        recent, before = scores[-k - 1:], scores[:-k]
        rising = all(a < b for a, b in zip(recent, recent[1:]))
        return rising and scores[-1] > max(before)
