"""When stack sampling should run at full rate: a regression is open, or the detector's score climbs to a high level."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol


class Episode(Protocol):
    @property
    def top_cause(self) -> str: ...


class Finding(Protocol):
    state: str
    score: float | None
    window_end: float
    regression: Episode | None


class Snapshot(Protocol):
    findings: dict[str, Finding]


# A burst costs ~16x the steady rate's py-spy CPU (49 vs 3 Hz), so a new high must also be high in itself:
# three quarters of the way to the detector's open_score (4.0; its close_score is 1.5). Healthy traffic on the
# recorded suite scores within about -2..+1.5 with single windows up to 3-4; replayed over the recordings
# (`infersight eval --replay ... --bursts`, docs/BENCHMARKS.md "Bursts") this level cut false bursts on steady
# traffic from 8.0 to 1.3 an hour and started more bursts before their regression opened than the ungated
# two-rise trigger did.
DEFAULT_MIN_SCORE = 3.0
# A minute of scored windows before a new high means anything: right after warm-up every window is one.
DEFAULT_MIN_HISTORY = 12
# Causes the target's own stacks cannot show: other processes taking its CPUs. A burst there buys a flame graph of
# the same code running slower, and adds 49 Hz of py-spy to a host already short of CPU (a soak on a shared host
# opened such an episode and burst at ~12 % of a core for minutes).
OUTSIDE_CAUSES = frozenset({"cpu_contention"})


class BurstPolicy:
    """`wants_burst(target)` for the stack sampler, from the detector's latest findings.

    True while the target's regression is open (unless its top cause is one of `outside_causes`, which the
    target's stacks cannot show), and when its score rose `rising_windows` windows
    running to above every score of the `history` windows before them (a new high, so the burst
    starts before the detector opens the episode and its flame graph has the onset) and is at least
    `min_score`, with `min_history` scored windows before them to compare with. The level is what
    keeps healthy traffic's occasional new highs (a noisy window on a quiet baseline) from paying
    for a full-rate burst.
    """

    def __init__(self, snapshot: Callable[[], Snapshot], rising_windows: int = 1, history: int = 60,
                 min_score: float = DEFAULT_MIN_SCORE, min_history: int = DEFAULT_MIN_HISTORY,
                 outside_causes: frozenset[str] = OUTSIDE_CAUSES) -> None:
        if rising_windows < 1:
            raise ValueError(f"rising_windows must be >= 1, got {rising_windows!r}")
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history!r}")
        if not 1 <= min_history <= history:
            raise ValueError(f"min_history must be within 1..history ({history}), got {min_history!r}")
        if min_score != min_score:
            raise ValueError(f"min_score must be a number, got {min_score!r}")
        self.rising_windows = rising_windows
        self.history = history
        self.min_score = min_score
        self.min_history = min_history
        self.outside_causes = outside_causes
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
            return finding.regression is None or finding.regression.top_cause not in self.outside_causes
        if finding.score is None or finding.state == "warmup":
            return False
        with self._lock:
            seen = self._scores.setdefault(target, deque(maxlen=self.history + self.rising_windows))
            if not seen or seen[-1][0] != finding.window_end:
                seen.append((finding.window_end, finding.score))
            scores = [s for _, s in seen]
        k = self.rising_windows
        if len(scores) < k + self.min_history or scores[-1] < self.min_score:
            return False
        recent, before = scores[-k - 1:], scores[:-k]
        rising = all(a < b for a, b in zip(recent, recent[1:]))
        return rising and scores[-1] > max(before)
