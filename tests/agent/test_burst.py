"""BurstPolicy: full-rate stack sampling while a regression is open or the score climbs to a new high."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from agent.burst import BurstPolicy


@dataclass
class F:
    state: str
    score: float | None
    window_end: float


@dataclass
class S:
    findings: dict = field(default_factory=dict)


def feed(policy: BurstPolicy, snap: S, scores: list[float], state: str = "healthy") -> list[bool]:
    out = []
    for i, score in enumerate(scores):
        snap.findings["w"] = F(state, score, float(i))
        out.append(policy.wants_burst("w"))
    return out


def test_open_regression_bursts_and_unknown_target_does_not() -> None:
    snap = S({"w": F("regression", 9.0, 1.0)})
    policy = BurstPolicy(lambda: snap)
    assert policy.wants_burst("w") is True
    assert policy.wants_burst("other") is False


def test_warmup_and_missing_score_never_burst() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=1, history=2)
    assert feed(policy, snap, [1.0, 2.0, 3.0, 4.0], state="warmup") == [False] * 4


def test_noise_below_the_recent_high_does_not_burst() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=2, history=5)
    # Rises twice running, but stays under the 5.0 seen before: noise, not onset.
    assert feed(policy, snap, [5.0, 1.0, 2.0, 3.0, 4.0]) == [False] * 5


def test_climb_to_a_new_high_bursts_at_the_second_rise() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=2, history=5)
    assert feed(policy, snap, [2.0, 1.0, 1.5, 2.5, 4.0, 3.0]) == [False, False, False, True, True, False]


def test_same_window_polled_twice_counts_once() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=1, history=1)
    snap.findings["w"] = F("healthy", 1.0, 0.0)
    assert policy.wants_burst("w") is False
    snap.findings["w"] = F("healthy", 2.0, 1.0)
    assert policy.wants_burst("w") is True
    assert policy.wants_burst("w") is True  # same window: still a rise over the one before


@pytest.mark.parametrize("kw", [{"rising_windows": 0}, {"history": 0}])
def test_bad_parameters_quote_the_value(kw) -> None:
    with pytest.raises(ValueError, match="0"):
        BurstPolicy(lambda: S(), **kw)


def test_forget_drops_a_targets_score_history() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=2, history=3)
    feed(policy, snap, [1.0, 2.0])
    policy.forget("w")
    policy.forget("never-seen")
    assert policy._scores == {}
    # A returning name starts over: two rises are not yet a new high over a history it no longer has.
    assert feed(policy, snap, [3.0, 4.0]) == [False, False]
