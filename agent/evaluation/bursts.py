"""The stack sampler's bursts replayed over a scored run: how many healthy traffic starts, and how many lead an opening.

A recording holds the windows; a replay gives each the detector's state and score, which is all `BurstPolicy`
reads. The sampler asks the policy once per segment and holds a burst `burst_hold_segments` segments after the
policy stops asking, unless its last answer was `BurstAsk.UNHELD` (a rise-only burst); at the default 5 s segment
and 5 s window that is one question per window, which is what this replay assumes. A burst is *false* when no
regression opens on any window it covers (its hold included): it paid the full rate for a flame graph nobody gets.
Its cost is its seconds at the burst rate (one rate: every burst window is at `burst_rate_hz`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.burst import BurstPolicy, Snapshot
from agent.config import DEFAULT_BURST_HOLD_SEGMENTS
from agent.sources.pyspy import BurstAsk
from analysis.scoring import Outcome

PolicyFactory = Callable[[Callable[[], Snapshot]], BurstPolicy]
_TARGET = "replayed"


@dataclass(frozen=True)
class _Episode:
    id: str
    top_cause: str


@dataclass(frozen=True)
class _Finding:
    state: str
    score: float | None
    window_end: float
    regression: _Episode | None


@dataclass(frozen=True)
class _Snapshot:
    findings: dict[str, _Finding]


@dataclass(frozen=True)
class Burst:
    first: int  # index of the first window sampled at the burst rate
    last: int
    opened: bool  # a regression opened on one of its windows


@dataclass(frozen=True)
class BurstReplay:
    """The bursts of one run. `early`: openings whose burst began on an earlier window (the onset is sampled);
    `unsampled`: openings on a window at the steady rate (a cause outside the target, `BurstPolicy.outside_causes`)."""

    windows: int
    seconds: float
    bursts: list[Burst]
    openings: int
    early: int
    unsampled: int = 0

    @property
    def false_bursts(self) -> int:
        return sum(1 for b in self.bursts if not b.opened)

    @property
    def burst_windows(self) -> int:
        return sum(b.last - b.first + 1 for b in self.bursts)

    @property
    def false_windows(self) -> int:
        """Windows at the burst rate in false bursts: what healthy traffic's bursts cost."""
        return sum(b.last - b.first + 1 for b in self.bursts if not b.opened)

    @property
    def interval(self) -> float:
        return self.seconds / self.windows if self.windows else 0.0

    def per_hour(self, count: int) -> float | None:
        return count * 3600.0 / self.seconds if self.seconds > 0 else None


def replay_bursts(outcomes: Sequence[Outcome], interval: float, make_policy: PolicyFactory = BurstPolicy,
                  hold_segments: int = DEFAULT_BURST_HOLD_SEGMENTS) -> BurstReplay:
    """The bursts a sampler asking `make_policy(snapshot)` once per window would have run over `outcomes`."""
    current: dict[str, _Finding] = {}
    policy = make_policy(lambda: _Snapshot(dict(current)))
    hold = 0
    bursts: list[Burst] = []
    first: int | None = None
    opened = False
    openings = early = unsampled = 0
    for i, o in enumerate(outcomes):
        episode = (_Episode(o.regression or _TARGET, o.top_cause) if o.state == "regression" and o.top_cause is not None
                   else None)
        current[_TARGET] = _Finding(o.state, o.score, o.end, episode)
        wanted = policy.wants_burst(_TARGET)
        burst = bool(wanted) or hold > 0
        # As the sampler does (PySpySampler._burst_now): an UNHELD answer adds no hold and leaves one running.
        if not wanted:
            hold = max(0, hold - 1)
        elif wanted is not BurstAsk.UNHELD:
            hold = hold_segments
        if burst and first is None:
            first, opened = i, False
        if o.opened is not None:
            openings += 1
            early += int(first is not None and first < i)
            unsampled += int(not burst)
            opened = opened or burst
        if not burst and first is not None:
            bursts.append(Burst(first, i - 1, opened))
            first = None
    if first is not None:
        bursts.append(Burst(first, len(outcomes) - 1, opened))
    return BurstReplay(windows=len(outcomes), seconds=len(outcomes) * interval, bursts=bursts,
                       openings=openings, early=early, unsampled=unsampled)


def burst_table(rows: Sequence[tuple[str, BurstReplay]]) -> str:
    """One line per run and a total: bursts, false ones per hour, seconds at the burst rate (all of them, and those
    of false bursts) per hour, openings, openings led (the burst began on an earlier window)."""
    lines = [f"{'scenario':40} {'hours':>6} {'bursts':>6} {'false':>5} {'false/h':>7} {'burst s/h':>9} "
             f"{'false s/h':>9} {'openings':>8} {'led':>4}"]

    def per_h(n: float, seconds: float) -> float:
        return n * 3600 / seconds if seconds else 0.0

    total_s = sum(r.seconds for _, r in rows)
    for name, r in rows:
        lines.append(f"{name[:40]:40} {r.seconds / 3600:6.2f} {len(r.bursts):6d} {r.false_bursts:5d} "
                     f"{per_h(r.false_bursts, r.seconds):7.1f} {per_h(r.burst_windows * r.interval, r.seconds):9.0f} "
                     f"{per_h(r.false_windows * r.interval, r.seconds):9.0f} {r.openings:8d} {r.early:4d}")
    n = sum(x.false_bursts for _, x in rows)
    lines.append(f"{'total':40} {total_s / 3600:6.2f} {sum(len(x.bursts) for _, x in rows):6d} {n:5d} "
                 f"{per_h(n, total_s):7.1f} {per_h(sum(x.burst_windows * x.interval for _, x in rows), total_s):9.0f} "
                 f"{per_h(sum(x.false_windows * x.interval for _, x in rows), total_s):9.0f} "
                 f"{sum(x.openings for _, x in rows):8d} {sum(x.early for _, x in rows):4d}")
    return "\n".join(lines) + "\n"
