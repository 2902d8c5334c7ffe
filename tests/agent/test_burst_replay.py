"""replay_bursts: the sampler's bursts over scored windows, false ones (no opening) told from those that lead one."""

from __future__ import annotations

from agent.burst import BurstPolicy
from agent.evaluation.bursts import burst_table, replay_bursts
from analysis.scoring import Outcome


def outcomes(scores: list[float | None], opened_at: int | None = None, open_for: int = 0) -> list[Outcome]:
    out = []
    for i, s in enumerate(scores):
        state = "warmup" if s is None else "healthy"
        if opened_at is not None and opened_at <= i < opened_at + open_for:
            state = "regression"
        out.append(Outcome(start=5.0 * i, end=5.0 * (i + 1), label="normal", phase=0, warmup=state == "warmup",
                           state=state, opened="r1" if i == opened_at else None, score=s))
    return out


def policy(snapshot) -> BurstPolicy:
    return BurstPolicy(snapshot, rising_windows=1, history=60, min_score=3.0, min_history=3)


class AlwaysHeld:
    """The policy as the sampler saw it before BurstAsk: every yes a plain True, held."""

    def __init__(self, snapshot) -> None:
        self.policy = policy(snapshot)

    def wants_burst(self, target: str) -> bool:
        return bool(self.policy.wants_burst(target))


def test_a_lone_high_on_healthy_traffic_is_one_false_burst_of_two_windows_without_the_hold() -> None:
    scores = [None, 0.0, 0.5, 0.2, 3.5, 0.1, 0.0, 0.3, 0.2, 0.1]
    got = replay_bursts(outcomes(scores), 5.0, policy, hold_segments=3)
    # Window 4 asks for it (UNHELD), window 5 is its window of grace; no hold after a rise-only burst.
    assert [(b.first, b.last, b.opened) for b in got.bursts] == [(4, 5, False)]
    assert got.false_bursts == 1 and got.burst_windows == got.false_windows == 2
    assert got.per_hour(got.false_bursts) == 72.0 and got.interval == 5.0
    assert got.openings == 0 and got.early == 0
    # Answered as a held burst, the sampler's hold keeps windows 6-8 at the burst rate too.
    held = replay_bursts(outcomes(scores), 5.0, AlwaysHeld, hold_segments=3)
    assert [(b.first, b.last, b.opened) for b in held.bursts] == [(4, 8, False)] and held.false_windows == 5
    table = burst_table([("lone", got)])
    assert "false s/h" in table and table.splitlines()[1].split()[5:7] == ["720", "720"]  # 10 s in 50 s


def test_a_climb_that_opens_a_regression_is_led_and_not_false() -> None:
    # 3.2 at window 4 starts the burst; the regression opens at window 5 and holds it to window 7, then the hold.
    got = replay_bursts(outcomes([None, 0.0, 0.5, 0.2, 3.2, 6.0, 7.0, 7.0, 0.1, 0.0, 0.1, 0.0, 0.0],
                                 opened_at=5, open_for=3), 5.0, policy, hold_segments=3)
    assert [(b.first, b.last, b.opened) for b in got.bursts] == [(4, 10, True)]
    assert got.false_bursts == 0 and got.openings == 1 and got.early == 1
    assert "total" in burst_table([("a", got)])


def test_a_long_episode_is_sampled_at_the_full_rate_for_the_policys_bound_and_its_hold() -> None:
    # Open for 20 windows (100 s): the policy asks for 30 s (windows 5-10), the sampler holds 3 segments more.
    scores = [None, 0.0, 0.5, 0.2, 0.1] + [6.0] * 20 + [0.0] * 6
    got = replay_bursts(outcomes(scores, opened_at=5, open_for=20), 5.0, policy, hold_segments=3)
    assert [(b.first, b.last, b.opened) for b in got.bursts] == [(5, 13, True)]
    unbounded = replay_bursts(outcomes(scores, opened_at=5, open_for=20), 5.0,
                              lambda snap: BurstPolicy(snap, min_history=3, max_seconds=float("inf")), hold_segments=3)
    assert [(b.first, b.last) for b in unbounded.bursts] == [(5, 27)]
