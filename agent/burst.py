"""When stack sampling should run at full rate: a regression is open, or the detector's score climbs to a high level."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.sources.pyspy import BurstAsk


class Episode(Protocol):
    @property
    def id(self) -> str: ...

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
# How long one burst asks for the full rate: the regression's flame graph needs ~1,000-1,600 active samples, what
# 30 s at 49 Hz gave the regression-stacks test (docs/BENCHMARKS.md "Samples per regression"); after that the
# steady rate goes on adding samples. An episode that stays open for minutes (a live soak's false alarms did, on
# a host whose CPUs slowed under the VM) no longer pays 49 Hz for all of them. The sampler holds
# `burst_hold_segments` segments more (15 s at the defaults), and a new episode, or the next rise after a calm
# window, starts a burst of its own.
DEFAULT_MAX_SECONDS = 30.0


# How long a rise that has opened no episode yet bursts at least: its own window and the next. After that it goes
# on only while each window still scores at the level (or has no score: no evidence that the rise ended), and it is
# answered UNHELD: the sampler adds no `burst_hold_segments` after it. Why: healthy traffic's false highs are short
# (on the soak-rate recording 4 of 6 fell back below 3.0 on the next window, none stayed at it past the third), and
# each paid its rise plus the 15 s hold, ~4-5 windows at 49 Hz, while a fault's score stays high until its episode
# opens, and the episode's burst then keeps the full budget, counted from the rise, and the hold. Replayed over every
# committed recording (docs/BENCHMARKS.md "Rise-only bursts without the hold", session 23): false-burst seconds an
# hour 240 -> 130 at 4 req/s, 40 -> 20 on steady traffic, with every opening led as before (53 of 121). The window
# of grace keeps two onsets whose score dipped below 3.0 for one window before the opening (1 window lost them); a
# lower rate for the rise (15 Hz, held; simulated) cost about what 1 window does but samples onsets at 15 Hz, not 49.
DEFAULT_RISE_MIN_WINDOWS = 2


@dataclass
class _Run:
    """The burst a target is in: since when the policy has asked for it (a window's end), for which episode, and
    over how many windows (the last one's end)."""

    started: float
    episode: str | None
    windows: int = 1
    last_end: float = float("nan")


class BurstPolicy:
    """`wants_burst(target)` for the stack sampler, from the detector's latest findings.

    Asks for the burst rate while the target's regression is open (unless its top cause is one of
    `outside_causes`, which the target's stacks cannot show), and when its score rose `rising_windows` windows
    running to above every score of the `history` windows before them (a new high, so the burst
    starts before the detector opens the episode and its flame graph has the onset) and is at least
    `min_score`, with `min_history` scored windows before them to compare with. The level is what
    keeps healthy traffic's occasional new highs (a noisy window on a quiet baseline) from paying
    for a full-rate burst.

    A rise that has opened no episode yet (rise-only) is answered `BurstAsk.UNHELD`: the sampler adds no hold after
    it. It bursts for `rise_min_windows` windows at least, the rise's included, then while each window scores at
    least `keep_score` (None: `min_score`) or has no score; once an episode opens within it, it is that episode's
    burst (`HELD`: the sampler holds `burst_hold_segments` after it), on the budget counted from the rise.

    One burst asks for at most `max_seconds` of windows (`math.inf`: no bound): a rise that leads into an
    episode shares that episode's budget, a new episode (another id: the cause moved) gets its own, and a
    burst ends for good only when the policy stops asking (the episode closed, the rise's evidence ended).
    """

    def __init__(self, snapshot: Callable[[], Snapshot], rising_windows: int = 1, history: int = 60,
                 min_score: float = DEFAULT_MIN_SCORE, min_history: int = DEFAULT_MIN_HISTORY,
                 outside_causes: frozenset[str] = OUTSIDE_CAUSES, max_seconds: float = DEFAULT_MAX_SECONDS,
                 rise_min_windows: int = DEFAULT_RISE_MIN_WINDOWS, keep_score: float | None = None) -> None:
        if rising_windows < 1:
            raise ValueError(f"rising_windows must be >= 1, got {rising_windows!r}")
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history!r}")
        if not 1 <= min_history <= history:
            raise ValueError(f"min_history must be within 1..history ({history}), got {min_history!r}")
        if min_score != min_score:
            raise ValueError(f"min_score must be a number, got {min_score!r}")
        if not max_seconds > 0:  # also refuses NaN
            raise ValueError(f"max_seconds must be > 0 (math.inf: no bound), got {max_seconds!r}")
        if isinstance(rise_min_windows, bool) or not isinstance(rise_min_windows, int) or rise_min_windows < 1:
            raise ValueError(f"rise_min_windows must be a whole number >= 1, got {rise_min_windows!r}")
        if keep_score is not None and keep_score != keep_score:
            raise ValueError(f"keep_score must be a number (None: min_score), got {keep_score!r}")
        self.rising_windows = rising_windows
        self.history = history
        self.min_score = min_score
        self.min_history = min_history
        self.outside_causes = outside_causes
        self.max_seconds = max_seconds
        self.rise_min_windows = rise_min_windows
        self.keep_score = min_score if keep_score is None else keep_score
        self._snapshot = snapshot
        self._scores: dict[str, deque[tuple[float, float]]] = {}
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def forget(self, target: str) -> None:
        """The target is no longer watched: its score history goes (a regex target gets a name per process)."""
        with self._lock:
            self._scores.pop(target, None)
            self._runs.pop(target, None)

    def wants_burst(self, target: str) -> BurstAsk:
        """NO, HELD (an episode's burst, or a rise that led into one) or UNHELD (a rise-only burst)."""
        finding = self._snapshot().findings.get(target)
        if finding is None:
            return BurstAsk.NO
        rise = self._new_high(target, finding)
        episode = finding.regression.id if finding.state == "regression" and finding.regression is not None else None
        with self._lock:
            run = self._runs.get(target)
            if finding.state == "regression":
                wanted = finding.regression is None or finding.regression.top_cause not in self.outside_causes
            elif rise:
                wanted = True
            elif run is not None and run.episode is None and finding.state != "warmup":
                # A rise-only burst goes on through its first windows, then while its evidence lasts.
                windows = run.windows + (finding.window_end != run.last_end)
                wanted = (windows <= self.rise_min_windows or finding.score is None
                          or finding.score >= self.keep_score)
            else:
                wanted = False
            if not wanted:
                self._runs.pop(target, None)
                return BurstAsk.NO
            if run is None or (episode is not None and run.episode not in (None, episode)):
                run = self._runs[target] = _Run(finding.window_end, episode, 1, finding.window_end)
            else:
                if run.episode is None:
                    run.episode = episode  # the rise led into this episode: its onset was sampled on the same budget
                if finding.window_end != run.last_end:
                    run.windows, run.last_end = run.windows + 1, finding.window_end
            if finding.window_end - run.started >= self.max_seconds:
                return BurstAsk.NO
            return BurstAsk.UNHELD if run.episode is None and finding.state != "regression" else BurstAsk.HELD

    def _new_high(self, target: str, finding: Finding) -> bool:
        """Whether the target's score rose to a new high at the level (its history takes healthy scored windows)."""
        if finding.state == "regression" or finding.score is None or finding.state == "warmup":
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
