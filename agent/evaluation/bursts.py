"""The stack sampler's bursts replayed over a scored run: how many healthy traffic starts, and how many lead an opening.

A recording holds the windows; a replay gives each the detector's state and score, which is all `BurstPolicy`
reads. The sampler asks the policy once per segment and holds a burst `burst_hold_segments` segments after the
policy stops asking; at the default 5 s segment and 5 s window that is one question per window, which is what
this replay assumes. A burst is *false* when no regression opens on any window it covers (its hold included):
it paid the full rate for a flame graph nobody gets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.burst import BurstPolicy, Snapshot
from agent.config import DEFAULT_BURST_HOLD_SEGMENTS
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
        burst = wanted or hold > 0
        hold = hold_segments if wanted else max(0, hold - 1)
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
    """One line per run and a total: bursts, false ones per hour, windows at the burst rate, openings led."""
    lines = [f"{'scenario':40} {'hours':>6} {'bursts':>6} {'false':>5} {'false/h':>7} {'burst win':>9} "
             f"{'openings':>8} {'led':>4}"]
    total_s = sum(r.seconds for _, r in rows)
    for name, r in [*rows, ("total", None)]:
        if r is None:
            n = sum(x.false_bursts for _, x in rows)
            lines.append(f"{'total':40} {total_s / 3600:6.2f} {sum(len(x.bursts) for _, x in rows):6d} {n:5d} "
                         f"{(n * 3600 / total_s if total_s else 0):7.1f} {sum(x.burst_windows for _, x in rows):9d} "
                         f"{sum(x.openings for _, x in rows):8d} {sum(x.early for _, x in rows):4d}")
            continue
        rate = r.per_hour(r.false_bursts)
        lines.append(f"{name[:40]:40} {r.seconds / 3600:6.2f} {len(r.bursts):6d} {r.false_bursts:5d} "
                     f"{(rate if rate is not None else 0):7.1f} {r.burst_windows:9d} {r.openings:8d} {r.early:4d}")
    return "\n".join(lines) + "\n"
