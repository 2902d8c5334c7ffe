"""BurstPolicy: full-rate stack sampling while a regression is open or the score climbs to a new high."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from agent.burst import DEFAULT_MIN_SCORE, DEFAULT_RISE_MIN_WINDOWS, BurstPolicy
from agent.sources.pyspy import BurstAsk
from analysis.detector import LatencyDetector

# The rise logic alone, as before the level and the history minimum were added. With no level every scored window
# is evidence enough to go on with a rise-only burst.
NO_LEVEL = {"min_score": float("-inf"), "min_history": 1}
NO, HELD, UNHELD = BurstAsk.NO, BurstAsk.HELD, BurstAsk.UNHELD


@dataclass
class F:
    state: str
    score: float | None
    window_end: float
    regression: object = None


@dataclass
class Episode:
    top_cause: str
    id: str = "r1"


@dataclass
class S:
    findings: dict = field(default_factory=dict)


def feed(policy: BurstPolicy, snap: S, scores: list[float | None], state: str = "healthy",
         start: float = 0.0) -> list[bool]:
    """Whether the sampler bursts on each window (the answer's kind aside: `answers` tells HELD from UNHELD)."""
    return [bool(a) for a in answers(policy, snap, scores, state, start)]


def answers(policy: BurstPolicy, snap: S, scores: list[float | None], state: str = "healthy",
            start: float = 0.0) -> list[BurstAsk]:
    out = []
    for i, score in enumerate(scores):
        snap.findings["w"] = F(state, score, start + float(i))
        out.append(policy.wants_burst("w"))
    return out


def test_open_regression_bursts_and_unknown_target_does_not() -> None:
    snap = S({"w": F("regression", 9.0, 1.0)})
    policy = BurstPolicy(lambda: snap)
    assert policy.wants_burst("w") is HELD
    assert policy.wants_burst("other") is NO


def test_warmup_and_missing_score_never_burst() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=1, history=2, **NO_LEVEL)
    assert feed(policy, snap, [1.0, 2.0, 3.0, 4.0], state="warmup") == [False] * 4


def test_noise_below_the_recent_high_does_not_burst() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=2, history=5, **NO_LEVEL)
    # Rises twice running, but stays under the 5.0 seen before: noise, not onset.
    assert feed(policy, snap, [5.0, 1.0, 2.0, 3.0, 4.0]) == [False] * 5


def test_climb_to_a_new_high_bursts_at_the_second_rise() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=2, history=5, **NO_LEVEL)
    # With no level, 3.0 after the high is still evidence: the rise-only burst goes on (UNHELD: no hold after it).
    assert answers(policy, snap, [2.0, 1.0, 1.5, 2.5, 4.0, 3.0]) == [NO, NO, NO, UNHELD, UNHELD, UNHELD]


def test_same_window_polled_twice_counts_once() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=1, history=1, **NO_LEVEL)
    snap.findings["w"] = F("healthy", 1.0, 0.0)
    assert policy.wants_burst("w") is NO
    snap.findings["w"] = F("healthy", 2.0, 1.0)
    assert policy.wants_burst("w") is UNHELD
    assert policy.wants_burst("w") is UNHELD  # same window: still a rise over the one before
    assert policy._runs["w"].windows == 1  # and one window of the rise-only burst, not two


@pytest.mark.parametrize("kw", [{"rising_windows": 0}, {"history": 0}, {"min_history": 0},
                                {"history": 5, "min_history": 6}, {"min_score": float("nan")},
                                {"max_seconds": 0}, {"max_seconds": float("nan")}, {"keep_score": float("nan")}])
def test_bad_parameters_quote_the_value(kw) -> None:
    with pytest.raises(ValueError, match="0|6|nan"):
        BurstPolicy(lambda: S(), **kw)


def test_forget_drops_a_targets_score_history() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=2, history=3, **NO_LEVEL)
    feed(policy, snap, [1.0, 2.0])
    policy.forget("w")
    policy.forget("never-seen")
    assert policy._scores == {}
    # A returning name starts over: two rises are not yet a new high over a history it no longer has.
    assert feed(policy, snap, [3.0, 4.0]) == [False, False]


def test_a_new_high_below_the_level_does_not_burst_and_one_at_it_does() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=1, history=10, min_score=3.0, min_history=3)
    # New highs on a quiet baseline (healthy traffic's noisy window) pay for nothing until one reaches 3.0.
    assert feed(policy, snap, [-1.0, -0.5, 0.0, 1.0, 2.9, 3.0]) == [False] * 5 + [True]


def test_no_new_high_before_min_history_scored_windows() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=1, history=10, min_score=0.0, min_history=3)
    # Right after warm-up every window is a new high over the few before it.
    assert feed(policy, snap, [1.0, 2.0, 3.0, 4.0]) == [False, False, False, True]


def test_the_default_level_lies_between_the_detectors_close_and_open_scores() -> None:
    # The level is on the detector's score scale: a detector rescaled without it would burst on everything or nothing.
    detector = LatencyDetector()
    assert detector.close_score < DEFAULT_MIN_SCORE < detector.open_score


def test_no_burst_while_the_open_regressions_top_cause_is_outside_the_target() -> None:
    # Other processes taking the CPUs: the target's stacks cannot show that, and 49 Hz of py-spy adds to it.
    snap = S({"w": F("regression", 9.0, 1.0, Episode("cpu_contention"))})
    policy = BurstPolicy(lambda: snap)
    assert policy.wants_burst("w") is NO
    # Re-ranked to a cause in the target's own code: the burst starts.
    snap.findings["w"] = F("regression", 9.0, 2.0, Episode("compute"))
    assert policy.wants_burst("w") is HELD
    assert BurstPolicy(lambda: snap, outside_causes=frozenset({"compute"})).wants_burst("w") is NO


def regression_windows(policy: BurstPolicy, snap: S, ends: list[float], episode: Episode) -> list[bool]:
    """Whether the sampler bursts on each window of an open episode; an episode's burst is always HELD."""
    out = []
    for end in ends:
        snap.findings["w"] = F("regression", 9.0, end, episode)
        answer = policy.wants_burst("w")
        assert answer in (NO, HELD), answer
        out.append(bool(answer))
    return out


def test_a_long_episode_bursts_for_max_seconds_then_samples_at_the_steady_rate() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, max_seconds=30.0)
    # Windows end every 5 s: six of them ask for the full rate (0-25 s), the rest of the episode does not.
    got = regression_windows(policy, snap, [5.0 * i for i in range(12)], Episode("compute"))
    assert got == [True] * 6 + [False] * 6
    # Polled again within the same window after the bound: still no.
    assert policy.wants_burst("w") is NO


def test_a_new_episode_gets_a_burst_of_its_own_and_a_closed_one_starts_over() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, max_seconds=10.0)
    assert regression_windows(policy, snap, [0.0, 5.0, 10.0, 15.0], Episode("lock", "r1")) == [True, True, False, False]
    # The cause moved: the detector closed r1 and opened r2 on the same window, a new flame graph to fill.
    assert regression_windows(policy, snap, [20.0, 25.0, 30.0], Episode("compute", "r2")) == [True, True, False]
    # Calm, then the same id again (a store that re-opens nothing would not, but a bound must not outlive a calm).
    snap.findings["w"] = F("healthy", 0.0, 35.0)
    assert policy.wants_burst("w") is NO
    assert regression_windows(policy, snap, [40.0], Episode("compute", "r2")) == [True]


def test_a_rise_that_leads_into_its_episode_shares_the_episodes_budget() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, rising_windows=1, history=10, min_score=3.0, min_history=3, max_seconds=15.0)
    assert feed(policy, snap, [0.0, 0.1, 0.2, 3.5]) == [False, False, False, True]  # window 3 (t=3) starts it
    # The regression opens on the next windows (t=8, 13, 18): 15 s after the rise began, the burst has had its time.
    assert regression_windows(policy, snap, [8.0, 13.0, 18.0, 23.0], Episode("gc")) == [True, True, False, False]


def test_forget_drops_a_targets_burst_too() -> None:
    snap = S()
    policy = BurstPolicy(lambda: snap, max_seconds=10.0)
    assert regression_windows(policy, snap, [0.0, 5.0, 10.0], Episode("gc")) == [True, True, False]
    policy.forget("w")
    assert regression_windows(policy, snap, [15.0], Episode("gc")) == [True]


def rise_policy(snap: S, **kw) -> BurstPolicy:
    return BurstPolicy(lambda: snap, rising_windows=1, history=10, min_score=3.0, min_history=3, **kw)


def test_a_lone_high_bursts_unheld_for_its_window_and_the_next_then_stops() -> None:
    # Healthy traffic's false high: one noisy window. Its burst asks for two windows and leaves the sampler no hold.
    snap = S()
    got = answers(rise_policy(snap), snap, [0.0, 0.1, 0.2, 3.5, 0.3, 0.2, 0.1])
    assert got == [NO, NO, NO, UNHELD, UNHELD, NO, NO]
    assert DEFAULT_RISE_MIN_WINDOWS == 2 and BurstPolicy(lambda: snap).rise_min_windows == 2


def test_a_rise_only_burst_goes_on_while_the_score_stays_at_the_level_or_has_none() -> None:
    snap = S()
    # 3.2 and 3.0 are no new highs, but still at the level; None (no latency reading) is no evidence either way.
    got = answers(rise_policy(snap), snap, [0.0, 0.1, 0.2, 3.5, 1.0, 3.2, None, 3.0, 2.9, 3.1])
    assert got == [NO, NO, NO, UNHELD, UNHELD, UNHELD, UNHELD, UNHELD, NO, NO]
    # Once ended, a window at the level that is no new high starts nothing: 3.1 is below 3.5.


def test_a_rise_only_burst_is_bounded_like_any_burst() -> None:
    snap = S()
    policy = rise_policy(snap, max_seconds=3.0)
    assert answers(policy, snap, [0.0, 0.1, 0.2, 3.5, 3.4, 3.3, 3.2, 3.1]) == [NO, NO, NO] + [UNHELD] * 3 + [NO, NO]


def test_one_window_of_rise_ends_on_the_next_calm_window() -> None:
    snap = S()
    got = answers(rise_policy(snap, rise_min_windows=1), snap, [0.0, 0.1, 0.2, 3.5, 1.0, 0.1])
    assert got == [NO, NO, NO, UNHELD, NO, NO]


def test_an_episode_that_opens_within_a_rise_only_burst_makes_it_held_on_the_budget_from_the_rise() -> None:
    snap = S()
    policy = rise_policy(snap, max_seconds=15.0)
    assert answers(policy, snap, [0.0, 0.1, 0.2, 3.5, 0.5]) == [NO, NO, NO, UNHELD, UNHELD]  # t = 3, 4
    # It opens on t = 5 (the burst's third window: the grace is spent, the episode keeps it going), HELD from now.
    got = []
    for end in (5.0, 10.0, 18.0, 19.0):
        snap.findings["w"] = F("regression", 9.0, end, Episode("gc"))
        got.append(policy.wants_burst("w"))
    assert got == [HELD, HELD, NO, NO]  # 15 s after the rise (t = 3) it has had its time


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_rise_min_windows_is_refused_with_its_value(bad) -> None:
    with pytest.raises(ValueError, match="rise_min_windows") as err:
        BurstPolicy(lambda: S(), rise_min_windows=bad)
    assert str(err.value).endswith(f"got {bad!r}")


def test_keep_score_sets_the_level_a_rise_only_burst_goes_on_at() -> None:
    snap = S()
    got = answers(rise_policy(snap, keep_score=1.5), snap, [0.0, 0.1, 0.2, 3.5, 0.3, 2.0, 1.6, 1.4])
    assert got == [NO, NO, NO, UNHELD, UNHELD, UNHELD, UNHELD, NO]
